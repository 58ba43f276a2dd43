"""--enable-deterministic-inference with float32 weights (a safetensors checkpoint), on one rank
and with --tp-size 2: a request's tokens and logprobs are the same bits alone, in batches of
mixed lengths, split into other prefill chunks and after a prefix-cache hit. Every float32
matmul (the LM head's included) takes the packed float kernel, whose sums run in one order
whatever the row count; other float weights are refused at start-up."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from radixserve import Engine
from radixserve.kernels.build import load_extension
from radixserve.managers.multiprocess_runtime import EngineStartupError
from tests.helpers.tiny_models import make_tiny_checkpoint

pytestmark = pytest.mark.skipif(load_extension() is None, reason="needs radixserve's C++ kernels")

NEW = 10
GREEDY = {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}
SEEDED = {"temperature": 0.9, "max_new_tokens": NEW, "ignore_eos": True, "sampling_seed": 3}

rng = random.Random(1)
TARGET = [rng.randrange(3, 250) for _ in range(37)]
OTHERS = [[rng.randrange(3, 250) for _ in range(rng.randrange(2, 60))] for _ in range(11)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-deterministic")
    make_tiny_checkpoint(folder, "llama", num_key_value_heads=2)
    return folder


def _kwargs(folder: Path, **overrides: Any) -> dict[str, Any]:
    return {
        "model_path": str(folder),
        "dtype": "float32",
        "skip_tokenizer_init": True,
        "max_total_tokens": 4096,
        "enable_deterministic_inference": True,
        "random_seed": 0,
        **overrides,
    }


def _run(engine: Engine, prompts: list[list[int]], params: dict[str, Any], index: int) -> tuple:
    """(tokens, logprobs) of prompts[index] when `prompts` run together."""
    out = engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True)[index]
    return out["output_ids"], [lp for lp, _, *_ in out["meta_info"]["output_token_logprobs"]]


def _check_batch_invariance(engine: Engine) -> tuple:
    """Runs TARGET alone, in batches of 2, 5 and 12 and after a prefix hit; returns alone's
    greedy (tokens, logprobs)."""
    results = {}
    for name, params in (("greedy", GREEDY), ("seeded", SEEDED)):
        engine.flush_cache()
        alone = _run(engine, [TARGET], params, 0)
        for size in (2, 5, 12):
            engine.flush_cache()
            others = OTHERS[: size - 1]
            at = len(others) // 2
            batch = [*others[:at], TARGET, *others[at:]]
            assert _run(engine, batch, params, at) == alone, (name, size)
        results[name] = alone
    engine.flush_cache()
    engine.generate(input_ids=[TARGET[:23] + [7, 8]], sampling_params=GREEDY)  # caches 23+
    assert _run(engine, [TARGET], GREEDY, 0) == results["greedy"], "after a prefix hit"
    return results["greedy"]


@pytest.fixture(scope="module")
def one_rank(checkpoint: Path) -> Iterator[tuple]:
    with Engine(**_kwargs(checkpoint)) as engine:
        yield _check_batch_invariance(engine)


def test_one_rank_same_bits_alone_in_batches_and_after_a_prefix_hit(one_rank: tuple) -> None:
    tokens, logprobs = one_rank
    assert len(tokens) == NEW and len(logprobs) == NEW


def test_one_rank_same_bits_in_other_prefill_chunks(checkpoint: Path, one_rank: tuple) -> None:
    with Engine(**_kwargs(checkpoint, chunked_prefill_size=8)) as chunked:
        assert _run(chunked, [TARGET], GREEDY, 0) == one_rank


def test_tp2_same_bits_alone_in_batches_and_in_chunks(checkpoint: Path) -> None:
    with Engine(**_kwargs(checkpoint, tp_size=2, dist_timeout=30)) as engine:
        alone = _check_batch_invariance(engine)
    with Engine(**_kwargs(checkpoint, tp_size=2, dist_timeout=30, chunked_prefill_size=8)) as eng:
        assert _run(eng, [TARGET], GREEDY, 0) == alone


def test_16_bit_float_weights_are_refused(checkpoint: Path) -> None:
    with pytest.raises(EngineStartupError, match="--dtype float32"):
        Engine(**_kwargs(checkpoint, dtype="bfloat16"))
