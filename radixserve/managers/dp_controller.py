"""The data-parallel controller: which replica serves each request (--load-balance-method).

It lives in the API process, next to the request router: every request passes through here on
its way in and every output on its way out, so the load of each replica (requests in flight and
the tokens they hold) is known exactly and at once, with no load reports from the schedulers.

Methods (SGLang's names):
- round_robin: replicas in turn.
- total_requests: the replica with the fewest requests in flight.
- total_tokens: the replica whose requests in flight hold the fewest tokens (prompt plus what
  was generated so far: their KV footprint).
- auto: SGLang resolves it to round_robin. Here it is cache-aware (as SGLang's router's
  cache_aware policy): a request whose prompt starts like one sent to a replica before goes to
  that replica, where its prefix is likely still in the radix cache, unless that replica is
  much busier than the others; otherwise the replica with the fewest requests in flight.
- follow_bootstrap_room is for prefill/decode disaggregation, which radixserve does not have:
  refused at startup.

Ties (e.g. every replica idle) go to the next replica after the last one chosen, so equal
loads still spread.
"""

from __future__ import annotations

import threading
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

LOAD_BALANCE_METHODS = ("auto", "round_robin", "total_requests", "total_tokens")

# Prompts are matched in blocks of this many tokens (a cheap stand-in for the replica's radix
# tree: a chain hash per block boundary). Shorter prompts never match.
PREFIX_BLOCK_TOKENS = 16
# A match this long (or covering half of the prompt) is worth following.
AFFINITY_MIN_TOKENS = 32
# ... unless the matched replica has this many more requests in flight than the least loaded
# one and more than BALANCE_REL_THRESHOLD times as many (the router's two thresholds).
BALANCE_ABS_THRESHOLD = 8
BALANCE_REL_THRESHOLD = 1.5
# Block hashes remembered per replica (least recently used dropped first).
PREFIX_INDEX_CAPACITY = 200_000


class PrefixIndex:
    """Which prompt prefixes were sent to one replica: chain hashes of whole blocks, LRU."""

    def __init__(self, capacity: int = PREFIX_INDEX_CAPACITY) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()

    @staticmethod
    def chain(input_ids: Sequence[int]) -> list[int]:
        hashes, prev = [], 0
        for start in range(0, len(input_ids) - PREFIX_BLOCK_TOKENS + 1, PREFIX_BLOCK_TOKENS):
            prev = hash((prev, tuple(input_ids[start : start + PREFIX_BLOCK_TOKENS])))
            hashes.append(prev)
        return hashes

    def match(self, chain: Sequence[int]) -> int:
        """Tokens of the longest remembered prefix of the prompt with this chain."""
        matched = 0
        for block_hash in chain:
            if block_hash not in self._blocks:
                break
            matched += PREFIX_BLOCK_TOKENS
        return matched

    def insert(self, chain: Sequence[int]) -> None:
        for block_hash in chain:
            self._blocks[block_hash] = None
            self._blocks.move_to_end(block_hash)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)


@dataclass
class ReplicaLoad:
    inflight_reqs: int = 0
    inflight_tokens: int = 0
    routed_reqs: int = 0  # every request ever sent to the replica
    prefix_routed_reqs: int = 0  # of those, sent there for a cached prefix (auto)


@dataclass
class _Inflight:
    replica: int
    tokens: int


class DataParallelController:
    """Routes requests to replicas and tracks their load. Thread-safe: requests arrive on the
    API's threads, outputs on the runtime's reader thread."""

    def __init__(self, dp_size: int, method: str = "auto") -> None:
        if method not in LOAD_BALANCE_METHODS:
            raise ValueError(
                f"--load-balance-method {method!r} is not supported "
                f"(supported: {', '.join(LOAD_BALANCE_METHODS)})"
            )
        self.dp_size = dp_size
        self.method = method
        self.loads = [ReplicaLoad() for _ in range(dp_size)]
        self._prefixes = [PrefixIndex() for _ in range(dp_size)]
        self._inflight: dict[str, _Inflight] = {}
        self._last = dp_size - 1  # so the first request goes to replica 0
        self._lock = threading.Lock()

    # -- routing ----------------------------------------------------------------------------
    def route(self, rid: str, input_ids: Sequence[int], session_id: str | None = None) -> int:
        """Choose the replica for a new request and count it there. A session's requests all
        go to one replica (its saved tokens live there), chosen by the session id."""
        with self._lock:
            chain = PrefixIndex.chain(input_ids) if self.method == "auto" else []
            if session_id is not None:
                replica, by_prefix = zlib.crc32(session_id.encode()) % self.dp_size, False
            else:
                replica, by_prefix = self._choose(input_ids, chain)
            self._last = replica
            load = self.loads[replica]
            load.inflight_reqs += 1
            load.inflight_tokens += len(input_ids)
            load.routed_reqs += 1
            load.prefix_routed_reqs += int(by_prefix)
            self._inflight[rid] = _Inflight(replica, len(input_ids))
            if chain:
                self._prefixes[replica].insert(chain)
            return replica

    def _choose(self, input_ids: Sequence[int], chain: Sequence[int]) -> tuple[int, bool]:
        if self.dp_size == 1:
            return 0, False
        if self.method == "round_robin":
            return (self._last + 1) % self.dp_size, False
        if self.method == "total_tokens":
            return self._least([load.inflight_tokens for load in self.loads]), False
        requests = [load.inflight_reqs for load in self.loads]
        least = self._least(requests)
        if self.method == "total_requests" or not chain:
            return least, False
        matches = [index.match(chain) for index in self._prefixes]
        best = max(range(self.dp_size), key=lambda d: (matches[d], -requests[d]))
        matched = matches[best]
        if matched < min(AFFINITY_MIN_TOKENS, len(input_ids) // 2) or matched == 0:
            return least, False
        gap = requests[best] - requests[least]
        if gap > BALANCE_ABS_THRESHOLD and requests[best] > BALANCE_REL_THRESHOLD * requests[least]:
            return least, False  # too busy: balance wins over the cache
        return best, True

    def _least(self, values: Sequence[int]) -> int:
        """The replica with the smallest value; ties go to the next one after the last choice."""
        order = [(self._last + 1 + i) % self.dp_size for i in range(self.dp_size)]
        return min(order, key=lambda d: values[d])

    # -- bookkeeping ------------------------------------------------------------------------
    def on_output(self, rid: str, new_tokens: int, finished: bool) -> None:
        with self._lock:
            entry = self._inflight.get(rid)
            if entry is None:
                return
            load = self.loads[entry.replica]
            if finished:
                del self._inflight[rid]
                load.inflight_reqs -= 1
                load.inflight_tokens -= entry.tokens
            else:
                entry.tokens += new_tokens
                load.inflight_tokens += new_tokens

    def forget(self, rid: str) -> None:
        """A routed request that never reached its replica (the send failed)."""
        self.on_output(rid, 0, finished=True)

    def replica_of(self, rid: str) -> int | None:
        with self._lock:
            entry = self._inflight.get(rid)
            return None if entry is None else entry.replica

    def snapshot(self, replica: int) -> dict[str, Any]:
        """The controller's counters for one replica (merged into its /get_server_info)."""
        with self._lock:
            load = self.loads[replica]
            return {
                "dp_rank": replica,
                "num_routed_reqs": load.routed_reqs,
                "num_prefix_routed_reqs": load.prefix_routed_reqs,
                "num_inflight_reqs": load.inflight_reqs,
                "num_inflight_tokens": load.inflight_tokens,
            }
