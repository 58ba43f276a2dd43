"""Tensor parallelism without processes: the head rules, the core split, and the step sync
that keeps the other ranks' request-to-token tables equal to rank 0's where a step reads."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from radixserve.distributed import parallel_state as ps
from radixserve.distributed.launch import dist_config_for
from radixserve.managers import tp_sync
from radixserve.mem_cache.req_to_token_pool import ReqToTokenPool
from radixserve.model_executor.step_io import StepInputs
from radixserve.options.errors import ServerArgsError
from radixserve.options.validate import valid_tp_sizes, validate_against_model
from radixserve.server_args import ServerArgs
from radixserve.utils.cpu_threads import plan_cpus, split_cores


def test_valid_tp_sizes_split_or_replicate_kv_heads() -> None:
    assert valid_tp_sizes(9, 3) == [1, 3, 9]  # SmolLM2-135M
    assert valid_tp_sizes(4, 2) == [1, 2, 4]
    assert valid_tp_sizes(32, 8) == [1, 2, 4, 8, 16, 32]


def test_bad_head_split_is_one_line_naming_tp_size_and_the_fix() -> None:
    with pytest.raises(ServerArgsError) as info:
        validate_against_model(2, 9, 3)
    message = str(info.value)
    assert message.startswith("--tp-size: 2 does not divide the model's 9 attention heads")
    assert message.endswith("use one of 1, 3, 9") and "\n" not in message
    with pytest.raises(ServerArgsError, match="neither divides nor is a multiple of the model's 4"):
        validate_against_model(6, 12, 4)
    validate_against_model(3, 9, 3)


def test_tp_options_are_accepted_and_checked() -> None:
    args = ServerArgs(tp_size=2, dist_timeout=30, dist_init_addr="127.0.0.1:1234")
    assert args.tp_size == 2 and args.dist_timeout == 30
    with pytest.raises(ServerArgsError, match="--tp-size: 2 cannot be combined with --quantiz"):
        ServerArgs(tp_size=2, quantization="w8a8_int8")
    with pytest.raises(ServerArgsError, match="--quantization bitsandbytes"):
        ServerArgs(tp_size=2, quantization="bitsandbytes")
    with pytest.raises(ServerArgsError, match="--dist-timeout"):
        ServerArgs(tp_size=2, dist_timeout=0)
    with pytest.raises(ServerArgsError, match="--dist-init-addr: expected HOST:PORT"):
        ServerArgs(tp_size=2, dist_init_addr="localhost")
    assert ServerArgs(tp_size=2, pp_size=2).pp_size == 2  # tests/unit/test_pipeline_parallel.py


def test_dist_config_address_choice() -> None:
    assert dist_config_for(2, "cpu", "10.0.0.1:5000", 7000, None).init_addr == "10.0.0.1:5000"
    assert dist_config_for(2, "cpu", None, 7000, 9).init_addr == "127.0.0.1:7000"
    config = dist_config_for(2, "cpu", None, None, 9)
    assert config.init_addr.startswith("127.0.0.1:") and config.timeout_s == 9
    assert (
        config.backend == "gloo" and dist_config_for(2, "cuda", None, None, None).backend == "nccl"
    )


def test_cores_split_between_ranks() -> None:
    assert split_cores([0, 1], 2) == [(0,), (1,)]
    assert split_cores([0, 1, 2, 3, 4], 2) == [(0, 1, 2), (3, 4)]
    assert split_cores([0, 1], 3) == [(0,), (1,), (0,)]  # fewer cores than ranks: shared
    plan = plan_cpus(1, env={}, allowed=[0, 1, 2, 3], tp_size=2)
    assert plan.compute == (2, 3) and not plan.pin_threads
    bound = plan_cpus(1, env={"SGLANG_CPU_OMP_THREADS_BIND": "0|1"}, allowed=[0, 1, 2], tp_size=2)
    assert bound.compute == (1,) and bound.light == (2,) and bound.pin_threads
    with pytest.raises(ValueError, match="none for TP rank 1"):
        plan_cpus(0, env={"SGLANG_CPU_OMP_THREADS_BIND": "0"}, allowed=[0, 1], tp_size=2)


class _Runner:
    """Stands in for ModelRunner: records the table as each forward sees it."""

    step_broadcaster: Any = None

    def __init__(self) -> None:
        self.seen: list[torch.Tensor] = []

    def forward(self, step: StepInputs, req_to_token: torch.Tensor) -> None:
        if self.step_broadcaster is not None:
            self.step_broadcaster(step, req_to_token)
        self.seen.append(req_to_token.clone())


def _step(rows: list[int], prefix: list[int], extend: list[int]) -> StepInputs:
    n = sum(extend)
    return StepInputs(False, [0] * n, [0] * n, rows, prefix, extend, torch.zeros(n), [])


def test_follower_tables_match_rank0_where_steps_read(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[object] = []
    monkeypatch.setattr(ps, "broadcast_object", lambda obj, src=0: sent.append(obj) or obj)
    pool = ReqToTokenPool(4, 16)
    leader_runner = _Runner()
    tp_sync.TpLeader(leader_runner, pool, timeout_s=60)  # type: ignore[arg-type]

    def slots(*values: int) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64)

    a, b = pool.alloc(), pool.alloc()
    assert a is not None and b is not None
    pool.write(a, 0, slots(10, 11, 12))
    leader_runner.forward(_step([a], [0], [3]), pool.req_to_token)
    pool.write(b, 0, slots(10, 11, 20, 21))  # a cached prefix shared with a, then new slots
    pool.write(a, 3, slots(13))
    leader_runner.forward(_step([a, b], [3, 2], [1, 2]), pool.req_to_token)
    pool.write(a, 1, slots(30, 31, 32))  # the cache swapped in its own slots for a's prefix
    pool.write(a, 4, slots(14))
    leader_runner.forward(_step([a], [4], [1]), pool.req_to_token)
    pool.free(b)
    c = pool.alloc()  # b's row again, for a request with other slots
    assert c == b
    pool.write(c, 0, slots(40, 41))
    leader_runner.forward(_step([c], [0], [2]), pool.req_to_token)
    # Decode steps send one new slot per request, not the whole row.
    last = sent[-1]
    assert isinstance(last, tp_sync.TpStep)
    assert [(u.row, u.start, u.slots.tolist()) for u in last.rows] == [(c, 0, [40, 41])]

    queue = [*sent, tp_sync.TpShutdown()]
    monkeypatch.setattr(ps, "broadcast_object", lambda obj, src=0: queue.pop(0))
    follower = _Runner()
    tp_sync.follow(follower, torch.full((4, 16), -1, dtype=torch.int64))  # type: ignore[arg-type]
    reads = [[(a, 3)], [(a, 4), (b, 4)], [(a, 5)], [(c, 2)]]
    for expected, got, wanted in zip(leader_runner.seen, follower.seen, reads, strict=True):
        for row, length in wanted:
            assert got[row, :length].tolist() == expected[row, :length].tolist()


def test_lost_broadcast_is_a_rank_lost_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(obj: object, src: int = 0) -> object:
        raise RuntimeError("Connection closed by peer")

    monkeypatch.setattr(ps, "broadcast_object", fail)
    leader = tp_sync.TpLeader(_Runner(), ReqToTokenPool(2, 8), timeout_s=1)  # type: ignore[arg-type]
    with pytest.raises(tp_sync.RankLostError, match="Connection closed by peer"):
        leader.broadcast_step(_step([], [], []), torch.zeros(2, 8))
    leader.shutdown()  # best effort: no raise
    with pytest.raises(tp_sync.RankLostError, match="waiting for rank 0 failed"):
        tp_sync.follow(_Runner(), torch.zeros(2, 8))  # type: ignore[arg-type]
