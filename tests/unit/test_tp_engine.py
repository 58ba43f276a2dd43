"""--tp-size 2 end to end in processes (gloo on the CPU): the same greedy tokens as one rank,
a clear error for heads that do not split, and a dead rank that takes the engine down."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixserve import Engine
from radixserve.managers.multiprocess_runtime import EngineStartupError
from tests.helpers.rank_kill import assert_rank_kill_ends_engine
from tests.helpers.tiny_models import make_tiny_checkpoint

GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
# Shared prefixes (radix cache hits rewrite request rows), a prompt longer than the prefill
# chunk, and several requests per batch.
PROMPTS = [
    [5, 6, 7, 8],
    [5, 6, 7, 8, 9, 10, 11],
    [12] * 20,
    list(range(30, 60)),
    [9, 10, 11],
]
DIST_TIMEOUT_S = 20


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Tiny Llamas with 4 query heads and 2 KV heads (split over 2 ranks) or 1 (replicated)."""
    folders = {}
    for kv in (2, 1):
        folder = tmp_path_factory.mktemp(f"tiny-tp-kv{kv}")
        make_tiny_checkpoint(folder, "llama", num_key_value_heads=kv)
        folders[kv] = folder
    return folders


def engine_kwargs(folder: Path) -> dict[str, object]:
    return {
        "model_path": str(folder),
        "dtype": "float32",
        "skip_tokenizer_init": True,
        "max_total_tokens": 2048,
        "chunked_prefill_size": 16,
        "random_seed": 0,
    }


def greedy(engine: Engine) -> list[list[int]]:
    return [r["output_ids"] for r in engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)]


@pytest.mark.parametrize(
    "kv_heads", [2, pytest.param(1, marks=pytest.mark.slow)], ids=["kv-split", "kv-replicated"]
)
def test_tp2_greedy_equals_tp1(checkpoints: dict[int, Path], kv_heads: int) -> None:
    kwargs = engine_kwargs(checkpoints[kv_heads])
    with Engine(runtime="thread", **kwargs) as single:
        expected = greedy(single)
    with Engine(tp_size=2, dist_timeout=DIST_TIMEOUT_S, **kwargs) as engine:
        assert len(engine.runtime.processes) == 3  # scheduler (rank 0), detokenizer, rank 1
        assert greedy(engine) == expected
        # Again, now through the radix cache's prefixes.
        assert greedy(engine) == expected


def test_tp2_ngram_tree_speculation_equals_plain_decoding(checkpoints: dict[int, Path]) -> None:
    """Tree verification under TP: rank 0 sends each verify step's own table and the KV moves of
    accepted branches to rank 1, whose heads must hold the same KV as rank 0's."""
    kwargs = engine_kwargs(checkpoints[2])
    params = {**GREEDY, "max_new_tokens": 24}
    with Engine(runtime="thread", **kwargs) as single:
        expected = single.generate(input_ids=PROMPTS, sampling_params=params)
    tree = {
        "speculative_algorithm": "NGRAM",
        "speculative_ngram_min_bfs_breadth": 3,
        "speculative_ngram_max_bfs_breadth": 3,
    }
    with Engine(tp_size=2, dist_timeout=DIST_TIMEOUT_S, **kwargs, **tree) as engine:
        got = engine.generate(input_ids=PROMPTS, sampling_params=params)
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
    assert sum(g["meta_info"]["spec_accept_token_num"] for g in got) > 0


# Slow (ranks start and fail): the message itself is checked without processes in
# tests/unit/test_tensor_parallel.py::test_valid_tp_sizes_split_or_replicate_kv_heads.
@pytest.mark.slow
def test_heads_that_do_not_split_fail_with_the_fix(
    checkpoints: dict[int, Path], capfd: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(EngineStartupError) as info:
        Engine(tp_size=3, **engine_kwargs(checkpoints[2]))
    message = str(info.value)
    assert "\n" not in message
    # The fix is named in the startup error, or, when a rank exits before the scheduler's
    # message arrives (seen on a loaded CI machine), in the one-line log of every rank above it.
    fix = "--tp-size: 3 does not divide the model's 4 attention heads; use one of 1, 2, 4"
    assert fix in message + capfd.readouterr().err


def test_thread_runtime_refuses_tp(checkpoints: dict[int, Path]) -> None:
    with pytest.raises(ValueError, match="runtime='process'"):
        Engine(runtime="thread", tp_size=2, **engine_kwargs(checkpoints[2]))


def test_killing_a_rank_ends_the_engine_within_the_timeout(checkpoints: dict[int, Path]) -> None:
    engine = Engine(tp_size=2, dist_timeout=DIST_TIMEOUT_S, **engine_kwargs(checkpoints[2]))
    try:
        assert_rank_kill_ends_engine(engine, 2, "radixserve-tp-rank-1", DIST_TIMEOUT_S)
    finally:
        engine.shutdown()
