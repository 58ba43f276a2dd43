"""The data-parallel controller's choices (--load-balance-method), its load bookkeeping, the
merged /get_server_info of several replicas, and the CPU split between replicas."""

from __future__ import annotations

import pytest

from radixserve.managers.dp_controller import (
    AFFINITY_MIN_TOKENS,
    BALANCE_ABS_THRESHOLD,
    PREFIX_BLOCK_TOKENS,
    DataParallelController,
    PrefixIndex,
)
from radixserve.managers.dp_info import merge_replica_infos
from radixserve.options.errors import ServerArgsError
from radixserve.server_args import ServerArgs
from radixserve.utils.cpu_threads import BIND_ENV, ReplicaCpuLayout, plan_cpus, plan_replicas


def finish(ctl: DataParallelController, rid: str) -> None:
    ctl.on_output(rid, 1, finished=True)


def test_round_robin_takes_turns_whatever_the_load() -> None:
    ctl = DataParallelController(3, "round_robin")
    assert [ctl.route(f"r{i}", [1, 2, 3]) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert [load.routed_reqs for load in ctl.loads] == [3, 2, 2]
    assert [load.inflight_reqs for load in ctl.loads] == [3, 2, 2]


def test_total_requests_picks_the_fewest_in_flight() -> None:
    ctl = DataParallelController(2, "total_requests")
    assert ctl.route("a", [1]) == 0
    assert ctl.route("b", [1]) == 1  # a tie goes to the next replica
    assert ctl.route("c", [1]) == 0
    finish(ctl, "b")
    finish(ctl, "a")
    # Replica 0 still holds c: d goes to the idle replica 1, then the loads tie again.
    assert [ctl.route(rid, [1]) for rid in ("d", "e", "f")] == [1, 0, 1]
    assert ctl.replica_of("c") == 0 and ctl.replica_of("a") is None


def test_total_tokens_counts_prompt_and_generated_tokens() -> None:
    ctl = DataParallelController(2, "total_tokens")
    assert ctl.route("long", list(range(100))) == 0
    assert ctl.route("short1", [1, 2]) == 1
    assert ctl.route("short2", [1, 2]) == 1  # 4 tokens there against 100
    for _ in range(50):
        ctl.on_output("short1", 2, finished=False)  # short1 grows to 102 tokens
    assert ctl.loads[1].inflight_tokens == 104
    assert ctl.route("next", [7]) == 0
    finish(ctl, "short1")
    assert ctl.loads[1].inflight_tokens == 2 and ctl.loads[1].inflight_reqs == 1


def test_auto_sends_a_shared_prefix_to_the_same_replica() -> None:
    ctl = DataParallelController(2, "auto")
    system = list(range(100, 100 + 2 * PREFIX_BLOCK_TOKENS))
    first = ctl.route("a", system + [1, 2, 3])
    other = ctl.route("b", list(range(200, 240)))  # unrelated: the idle replica
    assert other != first
    finish(ctl, "a")
    finish(ctl, "b")
    # The same system prompt, a different question: back to where its prefix is cached.
    assert ctl.route("c", system + [9, 9]) == first
    assert ctl.loads[first].prefix_routed_reqs == 1
    # Short prompts (under one block) never match: fewest in flight.
    assert ctl.route("d", [5, 6]) == other


def test_auto_prefers_balance_when_the_cached_replica_is_much_busier() -> None:
    ctl = DataParallelController(2, "auto")
    prefix = list(range(AFFINITY_MIN_TOKENS))
    for i in range(BALANCE_ABS_THRESHOLD + 2):
        ctl.route(f"hot{i}", prefix + [i])
    # While the loads were close, all went to the prefix's replica; then balance took over.
    hot = ctl.replica_of("hot0")
    assert [ctl.replica_of(f"hot{i}") for i in range(BALANCE_ABS_THRESHOLD + 1)] == [hot] * (
        BALANCE_ABS_THRESHOLD + 1
    )
    assert ctl.replica_of(f"hot{BALANCE_ABS_THRESHOLD + 1}") != hot


def test_prefix_index_matches_whole_leading_blocks_and_forgets_oldest() -> None:
    index = PrefixIndex(capacity=2)
    ids = list(range(3 * PREFIX_BLOCK_TOKENS))
    index.insert(PrefixIndex.chain(ids))
    # The first block was dropped (capacity 2): a match must start at the prompt's start.
    assert index.match(PrefixIndex.chain(ids)) == 0
    fresh = PrefixIndex()
    fresh.insert(PrefixIndex.chain(ids))
    changed = ids[: PREFIX_BLOCK_TOKENS + 3] + [999] + ids[PREFIX_BLOCK_TOKENS + 4 :]
    assert fresh.match(PrefixIndex.chain(changed)) == PREFIX_BLOCK_TOKENS


def test_unknown_methods_are_refused() -> None:
    with pytest.raises(ValueError, match="follow_bootstrap_room"):
        DataParallelController(2, "follow_bootstrap_room")
    with pytest.raises(ServerArgsError, match=r"follow_bootstrap_room.*supported: auto"):
        ServerArgs.from_kwargs(dp_size=2, load_balance_method="follow_bootstrap_room")
    args = ServerArgs.from_kwargs(dp_size=2, tp_size=2, load_balance_method="total_tokens")
    assert (args.dp_size, args.load_balance_method) == (2, "total_tokens")
    with pytest.raises(ServerArgsError, match="--dp-size: must be >= 1"):
        ServerArgs(dp_size=0)


def test_merged_info_sums_replicas_and_keeps_each() -> None:
    def info(running: int, avail: int, prompt: int, cached: int, usage: float) -> dict:
        return {
            "num_running_reqs": running,
            "num_waiting_reqs": 1,
            "max_total_num_tokens": 1000,
            "max_running_requests": 8,
            "available_kv_tokens": avail,
            "cached_tokens": 10,
            "token_usage": usage,
            "prompt_tokens_total": prompt,
            "cached_prompt_tokens_total": cached,
            "cache_hit_rate": cached / prompt,
        }

    merged = merge_replica_infos(
        [
            {**info(2, 900, 100, 50, 0.1), "dp_rank": 0, "num_routed_reqs": 3},
            {**info(1, 500, 300, 30, 0.5), "dp_rank": 1, "num_routed_reqs": 4},
        ]
    )
    assert merged["num_running_reqs"] == 3 and merged["num_waiting_reqs"] == 2
    assert merged["max_total_num_tokens"] == 2000 and merged["max_running_requests"] == 16
    assert merged["available_kv_tokens"] == 1400 and merged["num_routed_reqs"] == 7
    assert merged["token_usage"] == pytest.approx(0.3)
    assert merged["cache_hit_rate"] == pytest.approx(80 / 400)
    assert merged["dp_size"] == 2 and "dp_rank" not in merged
    assert [s["dp_rank"] for s in merged["internal_states"]] == [0, 1]
    assert [s["num_routed_reqs"] for s in merged["internal_states"]] == [3, 4]


def test_cores_split_between_replicas_and_their_ranks() -> None:
    # dp 2 on 2 cores: one core each, the light processes share.
    assert [plan_cpus(0, {}, [0, 1], 1, d, 2).compute for d in (0, 1)] == [(0,), (1,)]
    # dp 2 x tp 2 on 8 cores: replica-major contiguous pairs.
    computes = [plan_cpus(r, {}, range(8), 2, d, 2).compute for d in (0, 1) for r in (0, 1)]
    assert computes == [(0, 1), (2, 3), (4, 5), (6, 7)]
    # The bind variable lists dp x tp sets in the same order; spare cores go to light work.
    env = {BIND_ENV: "0|1|2|3"}
    plan = plan_cpus(1, env, range(6), 2, 1, 2)
    assert plan.compute == (3,) and plan.light == (4, 5) and plan.pin_threads
    with pytest.raises(ValueError, match=r"none for rank 2 \(data-parallel replica 1, TP rank 0\)"):
        plan_cpus(0, {BIND_ENV: "0|1"}, range(6), 2, 1, 2)


def test_replica_layout_says_who_runs_where(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("radixserve.utils.cpu_threads._allowed_cpus", lambda: [0, 1])
    layout = ReplicaCpuLayout(tuple(tuple(p) for p in plan_replicas(2, 1, env={})))
    text = layout.describe()
    assert "2 data-parallel replicas" in text
    assert "replica 0: CPUs 0 (1 threads)" in text and "replica 1: CPUs 1 (1 threads)" in text
    assert "share" not in text.split(";")[0] and layout.light == (0, 1)
    # Four ranks on two cores: replicas must share, and the description says so.
    crowded = ReplicaCpuLayout(tuple(tuple(p) for p in plan_replicas(2, 2, env={})))
    assert "replicas share CPUs 0,1" in crowded.describe()


def test_a_sessions_requests_stay_on_one_replica() -> None:
    ctl = DataParallelController(3, "round_robin")
    replicas = {ctl.route(f"s{i}", [1, 2], session_id="chat-7") for i in range(5)}
    assert len(replicas) == 1
    others = {ctl.route(f"t{i}", [1, 2], session_id=f"chat-{i}") for i in range(20)}
    assert len(others) > 1  # different sessions still spread
