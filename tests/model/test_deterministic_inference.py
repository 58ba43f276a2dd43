"""--enable-deterministic-inference on the real default model (its GGUF blocks): a request's
tokens and logprobs are the same bits alone, in batches of 2-16 requests of mixed lengths,
with its prompt split into other prefill chunks, after a prefix-cache hit that cuts the prompt
at an odd place, and sampled at temperature > 0 with a sampling_seed. Without the flag a
prefix hit moved the logprobs by up to 0.1 (attention's 8-row blocks) and a lone request's by
2e-6 (torch's logsumexp over one row); both are checked here. Setups the mode cannot keep are
refused at start-up."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from radixserve import Engine
from radixserve.managers.multiprocess_runtime import EngineStartupError
from radixserve.options.errors import ServerArgsError

NEW = 16
GREEDY = {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}
SEEDED = {"temperature": 0.8, "top_p": 0.9, "max_new_tokens": NEW, "ignore_eos": True}

rng = random.Random(0)
TARGET = [rng.randrange(100, 40000) for _ in range(41)]
OTHERS = [[rng.randrange(100, 40000) for _ in range(rng.randrange(3, 90))] for _ in range(15)]


def _run(engine: Engine, prompts: list[list[int]], params: dict[str, Any], index: int) -> tuple:
    """(tokens, logprobs) of prompts[index] when `prompts` run together."""
    out = engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True)[index]
    return out["output_ids"], [lp for lp, _, *_ in out["meta_info"]["output_token_logprobs"]]


@pytest.fixture(scope="module")
def engine(default_gguf: Path) -> Iterator[Engine]:
    with Engine(
        model_path=str(default_gguf), enable_deterministic_inference=True, max_total_tokens=8192
    ) as eng:
        yield eng


@pytest.mark.parametrize(
    "params", [GREEDY, {**SEEDED, "sampling_seed": 7}], ids=["greedy", "seeded"]
)
def test_same_bits_alone_and_in_any_batch(engine: Engine, params: dict[str, Any]) -> None:
    engine.flush_cache()
    alone = _run(engine, [TARGET], params, 0)
    for size in (2, 5, 16):
        engine.flush_cache()
        others = OTHERS[: size - 1]
        at = len(others) // 2
        batch = [*others[:at], TARGET, *others[at:]]
        assert _run(engine, batch, params, at) == alone, size


def test_same_bits_after_a_prefix_hit(engine: Engine) -> None:
    engine.flush_cache()
    alone = _run(engine, [TARGET], GREEDY, 0)
    for cut in (9, 30, 37):  # not multiples of attention's 8-row blocks
        engine.flush_cache()
        engine.generate(input_ids=[TARGET[:cut]], sampling_params={"max_new_tokens": 1})
        out = engine.generate(input_ids=[TARGET], sampling_params=GREEDY, return_logprob=True)[0]
        assert out["meta_info"]["cached_tokens"] >= cut - 1
        logprobs = [lp for lp, _, *_ in out["meta_info"]["output_token_logprobs"]]
        assert (out["output_ids"], logprobs) == alone, cut


def test_same_bits_in_other_prefill_chunks(default_gguf: Path, engine: Engine) -> None:
    engine.flush_cache()
    alone = _run(engine, [TARGET], GREEDY, 0)
    with Engine(
        model_path=str(default_gguf),
        enable_deterministic_inference=True,
        chunked_prefill_size=7,
        disable_radix_cache=True,
        max_total_tokens=4096,
    ) as chunked:
        assert _run(chunked, [TARGET], GREEDY, 0) == alone


def test_16_bit_float_weights_are_refused(default_gguf: Path) -> None:
    """Float32 weights take the batch-invariant packed kernel (tests/unit/
    test_deterministic_float.py); bfloat16 ones have none."""
    with pytest.raises(EngineStartupError, match="--dtype float32"):
        Engine(
            model_path=str(default_gguf),
            enable_deterministic_inference=True,
            quantization="unquant",
            dtype="bfloat16",
            max_total_tokens=1024,
        )


def test_reference_attention_is_refused(default_gguf: Path) -> None:
    with pytest.raises(ServerArgsError, match="intel_amx"):
        Engine(
            model_path=str(default_gguf),
            enable_deterministic_inference=True,
            attention_backend="torch_native",
        )
