"""Loading the real default model (the SmolLM2 GGUF) into a chosen conversion cache."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from radixserve.models.loader import LoadedModel, load_model
from radixserve.utils.cache_dir import CACHE_DIR_ENV


class TimedLoad(NamedTuple):
    loaded: LoadedModel
    seconds: float
    cache_dir: Path


@contextlib.contextmanager
def gguf_cache_dir(cache_dir: Path) -> Iterator[None]:
    """Point GGUF conversions at `cache_dir` for the duration of the block."""
    previous = os.environ.get(CACHE_DIR_ENV)
    os.environ[CACHE_DIR_ENV] = str(cache_dir)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(CACHE_DIR_ENV, None)
        else:
            os.environ[CACHE_DIR_ENV] = previous


def timed_load(gguf_path: Path, cache_dir: Path, dtype: str = "float32") -> TimedLoad:
    """load_model on the GGUF with conversions cached under `cache_dir`, timed."""
    with gguf_cache_dir(cache_dir):
        start = time.perf_counter()
        loaded = load_model(str(gguf_path), dtype=dtype)
        seconds = time.perf_counter() - start
    return TimedLoad(loaded, seconds, cache_dir)
