"""Queue ordering for each --schedule-policy and the prefill admission budgets."""

from __future__ import annotations

import random
from typing import Any

import torch

from radixserve.managers.retraction import NewTokenRatio, retraction_order
from radixserve.managers.schedule_batch import Req
from radixserve.managers.schedule_policy import PolicyConfig, PrefillAdder, SchedulePolicy
from radixserve.mem_cache.radix_cache import RadixCache
from radixserve.sampling.sampling_params import SamplingParams


class FakeKV:
    """Prefix matching against a real radix tree; nothing else is needed for ordering."""

    def __init__(self) -> None:
        self.cache = RadixCache()

    def add_cached(self, tokens: list[int]) -> None:
        self.cache.insert(tokens, torch.arange(len(tokens)) + 1000 * len(self.cache.root.children))

    def match_prefix(self, req: Req, *, update_stats: bool = True) -> Any:
        return self.cache.match_prefix(req.fill_ids[:-1], update_stats=update_stats)


def make_req(rid: str, ids: list[int], max_new: int = 16, priority: int = 0, t: float = 0.0) -> Req:
    params = SamplingParams.from_dict({"max_new_tokens": max_new})
    return Req(rid, ids, params, priority=priority, arrival_time=t)


def order(policy: str, reqs: list[Req], kv: FakeKV | None = None, **cfg: Any) -> list[str]:
    sched = SchedulePolicy(PolicyConfig(policy=policy, **cfg), rng=random.Random(1))
    return [r.rid for r in sched.order(reqs, kv or FakeKV())]


def test_fcfs_keeps_arrival_order() -> None:
    reqs = [make_req("b", [1, 2], t=2.0), make_req("a", [1, 2], t=1.0), make_req("c", [3], t=3.0)]
    assert order("fcfs", reqs) == ["a", "b", "c"]


def test_lof_puts_longest_output_first() -> None:
    reqs = [make_req("short", [1, 2], 4), make_req("long", [1, 2], 64), make_req("mid", [1], 16)]
    assert order("lof", reqs) == ["long", "mid", "short"]


def test_lpm_prefers_the_longest_cached_prefix() -> None:
    kv = FakeKV()
    kv.add_cached([5, 6, 7, 8, 9, 10])
    reqs = [
        make_req("none", [1, 2, 3, 4], t=0),
        make_req("two", [5, 6, 40, 41], t=1),
        make_req("five", [5, 6, 7, 8, 9, 50], t=2),
    ]
    assert order("lpm", reqs, kv) == ["five", "two", "none"]


def test_cache_aware_policies_fall_back_to_fcfs_without_radix_cache() -> None:
    kv = FakeKV()
    kv.add_cached([5, 6, 7, 8])
    reqs = [make_req("first", [1, 2, 3], t=0), make_req("cached", [5, 6, 7, 8, 9], t=1)]
    assert order("lpm", reqs, kv, radix_enabled=False) == ["first", "cached"]
    assert order("lpm", reqs, kv) == ["cached", "first"]


def test_dfs_weight_groups_requests_sharing_a_prefix() -> None:
    kv = FakeKV()
    kv.add_cached([5, 6, 7, 8])
    kv.add_cached([20, 21, 22, 23])
    reqs = [
        make_req("a1", [20, 21, 22, 23, 1], t=0),
        make_req("b1", [5, 6, 7, 8, 1], t=1),
        make_req("b2", [5, 6, 7, 8, 2], t=2),
    ]
    got = order("dfs-weight", reqs, kv)
    assert got[:2] == ["b1", "b2"] and got[2] == "a1"


def test_random_is_a_permutation() -> None:
    reqs = [make_req(str(i), [i + 1], t=i) for i in range(20)]
    got = order("random", reqs)
    assert sorted(got, key=int) == [str(i) for i in range(20)] and got != sorted(got, key=int)


def test_priority_ordering_and_its_direction() -> None:
    reqs = [make_req("low", [1], priority=1, t=0), make_req("high", [2], priority=9, t=1)]
    assert order("fcfs", reqs) == ["low", "high"]  # priority ignored unless enabled
    assert order("fcfs", reqs, enable_priority=True) == ["high", "low"]
    assert order("fcfs", reqs, enable_priority=True, low_priority_values_first=True) == [
        "low",
        "high",
    ]


def test_prefill_adder_chunks_a_long_prompt_and_closes_the_batch() -> None:
    adder = PrefillAdder(
        rem_total_tokens=1000,
        rem_input_tokens=1000,
        rem_chunk_tokens=64,
        new_token_ratio=0.5,
        page_size=4,
    )
    long_req = make_req("long", list(range(1, 200)))
    take = adder.plan(long_req, 199, 199)
    assert take == 64
    adder.commit(long_req, take, take, chunked=True)
    assert adder.chunked_req is long_req and adder.rem_chunk_tokens == 0


def test_prefill_adder_reserves_decode_room() -> None:
    adder = PrefillAdder(
        rem_total_tokens=100, rem_input_tokens=1000, rem_chunk_tokens=None, new_token_ratio=1.0
    )
    req = make_req("r", list(range(1, 50)), max_new=80)
    assert adder.plan(req, 49, 49) == 0  # 49 prompt + 80 reserved > 100
    small = make_req("s", list(range(1, 10)), max_new=20)
    assert adder.plan(small, 9, 9) == 9


def test_retraction_order_policies() -> None:
    a = make_req("a", [1] * 10)
    a.output_ids = [5] * 30
    b = make_req("b", [1] * 50, priority=5)
    b.output_ids = [5] * 2
    c = make_req("c", [1] * 5, priority=1)
    c.output_ids = [5] * 2
    assert [r.rid for r in retraction_order([a, b, c], "length")] == ["b", "c", "a"]
    assert [r.rid for r in retraction_order([a, b, c], "priority")] == ["a", "c", "b"]


def test_new_token_ratio_decays_and_resets() -> None:
    ratio = NewTokenRatio(1.0)
    start = ratio.value
    for _ in range(1000):
        ratio.decay()
    assert abs(ratio.value - start * 0.14) < 1e-9
    ratio.reset()
    assert ratio.value == start


def test_ordering_does_not_count_as_cache_hits() -> None:
    kv = FakeKV()
    kv.add_cached([5, 6, 7, 8, 9, 10])
    node = kv.cache.match_prefix([5, 6, 7, 8, 9]).last_node
    hits, seen = node.hit_count, node.last_access_time
    reqs = [make_req("a", [5, 6, 7, 8, 9, 11]), make_req("b", [5, 6, 30])]
    for policy in ("lpm", "dfs-weight"):
        order(policy, reqs, kv)
    assert (node.hit_count, node.last_access_time) == (hits, seen)
