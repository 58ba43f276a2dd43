"""Which waiting requests run next: queue ordering (--schedule-policy) and admission budgets.

Pure bookkeeping over Req objects and the KVManager's counts: no model calls, no tensors
beyond the prefix-match results.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixserve.managers.kv_manager import KVManager
    from radixserve.managers.schedule_batch import Req

CACHE_AWARE_POLICIES = frozenset({"lpm", "dfs-weight"})
# Above this many waiting requests, prefix matching every one each round costs more than it
# saves; SGLang falls back to FCFS the same way.
LPM_FALLBACK_QUEUE_LEN = 128
# A running request reserves at most this many future tokens when budgeting admissions.
RESERVE_CLIP_TOKENS = 4096


@dataclass(frozen=True)
class PolicyConfig:
    policy: str = "fcfs"
    enable_priority: bool = False
    low_priority_values_first: bool = False
    radix_enabled: bool = True


class SchedulePolicy:
    def __init__(self, config: PolicyConfig, rng: random.Random | None = None) -> None:
        policy = config.policy
        if policy in CACHE_AWARE_POLICIES and not config.radix_enabled:
            policy = "fcfs"
        self.policy = policy
        self.config = config
        self.rng = rng or random.Random(0)

    def order(self, waiting: list[Req], kv: KVManager) -> list[Req]:
        """Return the waiting queue in the order admission should try it."""
        policy = self.policy
        if policy in CACHE_AWARE_POLICIES and len(waiting) > LPM_FALLBACK_QUEUE_LEN:
            policy = "fcfs"
        if policy == "random":
            ordered = list(waiting)
            self.rng.shuffle(ordered)
            return ordered
        if policy == "lpm":
            prefix_lens = {id(r): len(kv.match_prefix(r, update_stats=False)[0]) for r in waiting}
            return sorted(waiting, key=lambda r: (self._prio(r), -prefix_lens[id(r)]))
        if policy == "dfs-weight":
            return _dfs_weight_order(waiting, kv)
        if policy == "lof":
            return sorted(waiting, key=lambda r: (self._prio(r), -r.max_new_tokens))
        # fcfs and priority: arrival order, priority first when enabled.
        return sorted(waiting, key=lambda r: (self._prio(r), r.arrival_time))

    def _prio(self, req: Req) -> int:
        if not self.config.enable_priority and self.policy != "priority":
            return 0
        # By default larger values run first (SGLang); the flag flips it.
        return req.priority if self.config.low_priority_values_first else -req.priority


def _dfs_weight_order(waiting: list[Req], kv: KVManager) -> list[Req]:
    """Group requests that share a cached prefix: heavier prefix-tree branches first."""
    by_node: dict[int, list[Req]] = defaultdict(list)
    nodes: dict[int, object] = {}
    for req in waiting:
        _, node = kv.match_prefix(req, update_stats=False)
        by_node[id(node)].append(req)
        nodes[id(node)] = node
    weight: dict[int, int] = defaultdict(int)
    for node_id, reqs in by_node.items():
        node = nodes[node_id]
        while node is not None:
            weight[id(node)] += len(reqs)
            node = getattr(node, "parent", None)
    ordered_groups = sorted(by_node.items(), key=lambda item: -weight[item[0]])
    return [req for _, reqs in ordered_groups for req in reqs]


@dataclass
class PrefillAdder:
    """Admits requests into one prefill batch within the token budgets.

    rem_total_tokens: KV the batch may take after reserving future decode tokens of running
    requests; rem_input_tokens: --max-prefill-tokens; rem_chunk_tokens: --chunked-prefill-size
    (None = no chunking). The first request is always admitted if its KV fits, even past
    max-prefill-tokens, so a long prompt cannot starve. A request whose tail does not fit the
    chunk budget gets a page-aligned chunk and closes the batch (one chunked request at a time).
    """

    rem_total_tokens: int
    rem_input_tokens: int
    rem_chunk_tokens: int | None
    new_token_ratio: float
    page_size: int = 1
    reqs: list[Req] = field(default_factory=list)
    extend_lens: list[int] = field(default_factory=list)
    chunked_req: Req | None = None

    def reserve_for(self, req: Req) -> int:
        return int(min(req.remaining_new_tokens(), RESERVE_CLIP_TOKENS) * self.new_token_ratio)

    def would_reject(self, req: Req, extend_len: int) -> bool:
        """Cheap pre-check before a request's prefix is locked."""
        if self.reqs and self.rem_input_tokens <= 0:
            return True
        return self.plan(req, extend_len, extend_len) == 0

    def plan(self, req: Req, extend_len: int, kv_needed: int) -> int:
        """How many of the request's next `extend_len` tokens this batch can take (0: none)."""
        if self.rem_chunk_tokens is None or extend_len <= self.rem_chunk_tokens:
            if self.reqs and extend_len > self.rem_input_tokens:
                return 0
            if kv_needed + self.reserve_for(req) > self.rem_total_tokens:
                return 0
            return extend_len
        # Too long for this batch's chunk budget: take a page-aligned chunk.
        take = min(self.rem_chunk_tokens, self.rem_total_tokens)
        take = take // self.page_size * self.page_size
        return max(take, 0)

    def commit(self, req: Req, extend_len: int, kv_needed: int, chunked: bool) -> None:
        self.reqs.append(req)
        self.extend_lens.append(extend_len)
        self.rem_total_tokens -= kv_needed
        self.rem_input_tokens -= extend_len
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= extend_len
        if chunked:
            self.chunked_req = req
        else:
            self.rem_total_tokens -= self.reserve_for(req)
