"""The scheduler's decode-only tokenizer on a warm start (managers/scheduler_tokenizer.py):
decodes as the full tokenizer does, knows its special ids and class, and loads the full
tokenizer only when something else is asked of it (a grammar backend)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from radixserve.managers import scheduler_tokenizer
from radixserve.managers.scheduler_factory import _scheduler_tokenizer
from radixserve.managers.scheduler_tokenizer import DecodeOnlyTokenizer, full_tokenizer
from radixserve.models.tokenizer import tokenizer_source
from radixserve.server_args import ServerArgs
from radixserve.utils.cache_dir import CACHE_DIR_ENV
from radixserve.utils.light_tokenizer import tokenizer_class_name
from tests.helpers.hf_reference import default_gguf_path


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def default_folder() -> str:
    path = default_gguf_path()
    if path is None:
        pytest.skip("the default model is not installed")
    return str(tokenizer_source(path))


def test_a_warm_start_gets_the_decode_only_tokenizer(default_folder: str) -> None:
    args = ServerArgs.from_kwargs(model_path=default_folder)
    first, first_decoder, first_class = _scheduler_tokenizer(args, default_folder, True)
    assert not isinstance(first, DecodeOnlyTokenizer) and first_decoder is not None
    warm, decoder, class_name = _scheduler_tokenizer(args, default_folder, True)
    assert isinstance(warm, DecodeOnlyTokenizer)
    assert (decoder, class_name) == (first_decoder, first_class)
    assert class_name == tokenizer_class_name(first)
    assert (warm.eos_token_id, warm.bos_token_id) == (first.eos_token_id, first.bos_token_id)
    rng = random.Random(3)
    for _ in range(100):
        ids = [rng.randrange(len(first)) for _ in range(rng.randint(1, 30))]
        for skip in (True, False):
            assert warm.decode(ids, skip_special_tokens=skip) == first.decode(
                ids, skip_special_tokens=skip
            )
    # Without decode_only (the thread runtime, whose API side shares the tokenizer): full.
    assert not isinstance(_scheduler_tokenizer(args, default_folder, False)[0], DecodeOnlyTokenizer)


def test_the_full_tokenizer_loads_once_on_other_use(default_folder: str) -> None:
    from radixserve.managers.light_detokenizer import light_decoder_source
    from radixserve.models.tokenizer import get_tokenizer

    full = get_tokenizer(default_folder)
    source = light_decoder_source(full)
    assert source is not None
    scheduler_tokenizer.remember(default_folder, full, source)
    loads: list[Any] = []

    def load_full() -> Any:
        loads.append(1)
        return full

    warm = scheduler_tokenizer.remembered(default_folder, load_full)
    assert isinstance(warm, DecodeOnlyTokenizer)
    warm.decode([1, 2, 3])
    assert loads == []
    assert warm.all_special_ids == full.all_special_ids  # another attribute: the full one
    assert full_tokenizer(warm) is full and full_tokenizer(full) is full
    assert loads == [1]


def test_no_record_without_a_checked_decoder(default_folder: str, tmp_path: Path) -> None:
    assert scheduler_tokenizer.remembered(default_folder, lambda: None) is None
    assert scheduler_tokenizer.remembered(str(tmp_path / "absent"), lambda: None) is None
