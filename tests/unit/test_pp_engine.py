"""--pp-size end to end in processes (gloo on the CPU): the same greedy tokens as one rank with
2 stages, with 2 stages of 2 tensor-parallel ranks, and with 3 stages and a tied LM head; a
dead stage takes the engine down."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from radixserve import Engine
from radixserve.managers.multiprocess_runtime import EngineStartupError
from tests.helpers.rank_kill import assert_rank_kill_ends_engine
from tests.helpers.tiny_models import make_tiny_checkpoint
from tests.unit.test_tp_engine import DIST_TIMEOUT_S, engine_kwargs, greedy


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama with 3 layers (2 stages split them 2 + 1), 4 query and 2 KV heads."""
    folder = tmp_path_factory.mktemp("tiny-pp")
    make_tiny_checkpoint(folder, "llama", num_hidden_layers=3)
    return folder


@pytest.fixture(scope="module")
def expected(checkpoint: Path) -> list[list[int]]:
    with Engine(runtime="thread", **engine_kwargs(checkpoint)) as single:
        return greedy(single)


def test_pp2_greedy_equals_one_rank(checkpoint: Path, expected: list[list[int]]) -> None:
    # The default micro-batches: each step's batch in 2 parts.
    with Engine(pp_size=2, dist_timeout=DIST_TIMEOUT_S, **engine_kwargs(checkpoint)) as engine:
        names = [p.name for p in engine.runtime.processes]
        assert names == [
            "radixserve-scheduler",
            "radixserve-detokenizer",
            "radixserve-pp-1-tp-0-rank-1",
        ]
        assert greedy(engine) == expected
        assert greedy(engine) == expected  # again, through the radix cache's prefixes


@pytest.mark.slow
def test_tp2_pp2_greedy_equals_one_rank(checkpoint: Path, expected: list[list[int]]) -> None:
    kwargs = engine_kwargs(checkpoint)
    with Engine(
        tp_size=2, pp_size=2, pp_max_micro_batch_size=1, dist_timeout=DIST_TIMEOUT_S, **kwargs
    ) as engine:
        assert len(engine.runtime.processes) == 5  # 4 ranks and the detokenizer
        assert greedy(engine) == expected
        assert greedy(engine) == expected


def _logprobs(engine: Engine) -> list[Any]:
    """Prompt and output logprobs of two requests (the prompt rows span micro-batches)."""
    outs = engine.generate(
        input_ids=[list(range(40, 60)), [7, 8, 9]],
        sampling_params={"temperature": 0, "max_new_tokens": 4},
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=2,
    )
    keys = ("input_token_logprobs", "output_token_logprobs", "input_top_logprobs")
    return [[out["meta_info"][k] for k in keys] for out in outs]


def _close(got: Any, want: Any) -> bool:
    if isinstance(want, (list, tuple)):
        return len(got) == len(want) and all(_close(g, w) for g, w in zip(got, want, strict=True))
    if isinstance(want, float):
        return abs(got - want) < 1e-4
    return bool(got == want)


@pytest.mark.slow
def test_pp3_tied_head_greedy_and_logprobs_equal_one_rank(tmp_path: Path) -> None:
    make_tiny_checkpoint(tmp_path, "qwen2", num_hidden_layers=3, tie_word_embeddings=True)
    kwargs = engine_kwargs(tmp_path)
    with Engine(runtime="thread", **kwargs) as single:
        want, want_lp = greedy(single), _logprobs(single)
    with Engine(
        pp_size=3, pp_max_micro_batch_size=1, dist_timeout=DIST_TIMEOUT_S, **kwargs
    ) as engine:
        assert greedy(engine) == want
        assert _close(_logprobs(engine), want_lp)


@pytest.mark.slow
def test_pp2_embeddings_equal_one_rank(checkpoint: Path) -> None:
    kwargs = {**engine_kwargs(checkpoint), "is_embedding": True}
    prompts = [[5, 6, 7], list(range(30, 50)), [9]]
    with Engine(runtime="thread", **kwargs) as single:
        want = [r["embedding"] for r in single.encode(input_ids=prompts)]
    with Engine(
        pp_size=2, pp_max_micro_batch_size=1, dist_timeout=DIST_TIMEOUT_S, **kwargs
    ) as engine:
        got = [r["embedding"] for r in engine.encode(input_ids=prompts)]
    assert _close(got, want)


def test_thread_runtime_refuses_pp(checkpoint: Path) -> None:
    with pytest.raises(ValueError, match="--pp-size 2 needs one process per rank"):
        Engine(runtime="thread", pp_size=2, **engine_kwargs(checkpoint))


@pytest.mark.slow
def test_killing_a_stage_ends_the_engine_within_the_timeout(checkpoint: Path) -> None:
    engine = Engine(pp_size=2, dist_timeout=DIST_TIMEOUT_S, **engine_kwargs(checkpoint))
    try:
        assert_rank_kill_ends_engine(engine, 2, "radixserve-pp-1-tp-0-rank-1", DIST_TIMEOUT_S)
    finally:
        engine.shutdown()


# Slow (ranks start and fail); the message itself is checked without processes in
# tests/unit/test_pipeline_parallel.py::test_more_stages_than_layers_is_refused_with_the_reason.
@pytest.mark.slow
def test_more_stages_than_layers_fail_with_the_reason(
    checkpoint: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(EngineStartupError) as info:
        Engine(pp_size=4, dist_timeout=DIST_TIMEOUT_S, **engine_kwargs(checkpoint))
    reason = "--pp-size 4 needs at least one decoder layer per stage; the model has 3"
    assert reason in str(info.value) + capfd.readouterr().err
