"""Glue between a request's KV needs and the three memory structures.

The allocator hands out slots, the prefix cache remembers which token sequences own which slots,
and the request-to-token table records each running request's slots. This class moves ownership
between them; it never decides which request gets memory (that is schedule_policy's job).

Invariant (checked by `check_conservation`): free tokens + tokens held by the prefix cache +
tokens owned by live requests == pool size, counted in whole pages.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from radixserve.mem_cache.base_prefix_cache import MatchResult
from radixserve.mem_cache.namespace import namespaced_key

if TYPE_CHECKING:
    from radixserve.managers.schedule_batch import Req
    from radixserve.mem_cache.allocator import TokenToKVPoolAllocator
    from radixserve.mem_cache.base_prefix_cache import BasePrefixCache
    from radixserve.mem_cache.hicache.controller import HiCacheController
    from radixserve.mem_cache.req_to_token_pool import ReqToTokenPool

logger = logging.getLogger(__name__)


class TierHits(NamedTuple):
    """Where the tokens of one admission match came from."""

    device: int
    host: int
    storage: int


class KVManager:
    def __init__(
        self,
        allocator: TokenToKVPoolAllocator,
        req_to_token_pool: ReqToTokenPool,
        prefix_cache: BasePrefixCache,
        hicache: HiCacheController | None = None,
    ) -> None:
        self.allocator = allocator
        self.req_to_token_pool = req_to_token_pool
        self.prefix_cache = prefix_cache
        self.page_size = allocator.page_size
        # The host/disk tiers under the radix cache (--enable-hierarchical-cache).
        self.hicache = hicache
        self.last_hits = TierHits(0, 0, 0)
        if hicache is not None and hicache.config.write_policy == "write_back":
            prefix_cache.evict_listener = hicache.backup  # type: ignore[attr-defined]
        # Called with each request released (before its row is freed) and after hard_reset:
        # a speculative draft model's own KV pool follows the target's this way.
        self.release_hooks: list[Callable[[Req], None]] = []
        self.reset_hooks: list[Callable[[], None]] = []

    # -- capacity ---------------------------------------------------------------------------
    def available_tokens(self) -> int:
        """Tokens that could be allocated now, evicting unlocked cache entries if needed."""
        return self.allocator.available_size() + self.prefix_cache.evictable_size()

    def tokens_needed(self, req: Req, num_new: int) -> int:
        """Slots (counted in whole pages) that extending `req` by num_new tokens would take."""
        if self.page_size == 1:
            return num_new
        used_in_last_page = req.kv_len % self.page_size
        room = (self.page_size - used_in_last_page) % self.page_size
        extra = max(num_new - room, 0)
        pages = -(-extra // self.page_size)
        return pages * self.page_size

    # -- admission --------------------------------------------------------------------------
    def match_prefix(self, req: Req, *, update_stats: bool = True) -> tuple[torch.Tensor, object]:
        """Longest cached prefix of the request's tokens, never covering its last token, so the
        last token's logits are always computed. Ordering the queue passes update_stats=False,
        so looking does not count as a hit for lfu/slru eviction."""
        fill = req.key_ids
        key = namespaced_key(fill[: len(fill) - 1], req.lora_id)
        match = self.prefix_cache.match_prefix(key, update_stats=update_stats)
        if self.hicache is None or not update_stats:
            return match
        device = len(match.indices)
        if device and self.hicache.config.write_policy == "write_through_selective":
            self.hicache.backup(key, match.indices)  # a reused prefix earns a host copy
        match, host, storage = self._load_back(key, match, req.priority)
        self.last_hits = TierHits(device, host, storage)
        return match

    def _load_back(
        self, key: list[int], match: MatchResult, priority: int
    ) -> tuple[MatchResult, int, int]:
        """Extend a device match with blocks from the host or disk tier: copy them into fresh
        device slots and insert them into the radix cache, so the extend computes only what no
        tier holds. Returns the longer match and the host and storage token counts."""
        assert self.hicache is not None
        device_len = len(match.indices)
        limit = len(key) // self.page_size * self.page_size
        plan = self.hicache.find(key, device_len, limit)
        if plan.tokens == 0:
            return match, 0, 0
        # Locked so that making room for the loaded blocks cannot evict the device prefix.
        self.prefix_cache.inc_lock_ref(match.last_node)
        slots = self.allocator.alloc(plan.tokens)
        if slots is None:
            self._evict(plan.tokens - self.allocator.available_size())
            slots = self.allocator.alloc(plan.tokens)
        if slots is None:
            self.prefix_cache.dec_lock_ref(match.last_node)
            self.hicache.release(plan)
            return match, 0, 0
        self.hicache.load(plan, slots)
        end = device_len + plan.tokens
        already = self.prefix_cache.insert(
            key[:end], torch.cat([match.indices, slots]), priority=priority
        )
        self._free(slots[: max(already - device_len, 0)])  # nothing, unless the tree changed
        self.prefix_cache.dec_lock_ref(match.last_node)
        longer = self.prefix_cache.match_prefix(key[:end], update_stats=False)
        return longer, plan.host_tokens, plan.storage_tokens

    def admit(self, req: Req, prefix_indices: torch.Tensor, last_node: object) -> bool:
        """Give `req` a table row and adopt its cached prefix (locked). False if no row free."""
        idx = self.req_to_token_pool.alloc()
        if idx is None:
            return False
        req.req_pool_idx = idx
        n = len(prefix_indices)
        if n:
            self.req_to_token_pool.write(idx, 0, prefix_indices)
        self.prefix_cache.inc_lock_ref(last_node)
        req.last_node = last_node
        req.cached_len = n
        req.kv_len = n
        return True

    def alloc_extend(self, req: Req, num_new: int) -> torch.Tensor | None:
        """Slots for the next `num_new` tokens of `req`, evicting from the cache if needed."""
        assert req.req_pool_idx is not None
        last_loc = -1
        if req.kv_len > 0:
            last_loc = int(self.req_to_token_pool.req_to_token[req.req_pool_idx, req.kv_len - 1])
        slots = self.allocator.alloc(num_new, last_loc)
        if slots is None:
            shortfall = self.tokens_needed(req, num_new) - self.allocator.available_size()
            self._evict(shortfall)
            slots = self.allocator.alloc(num_new, last_loc)
            if slots is None:
                return None
        self.req_to_token_pool.write(req.req_pool_idx, req.kv_len, slots)
        return slots

    def alloc_decode(
        self, reqs: Sequence[Req], widths: Sequence[int] | None = None
    ) -> torch.Tensor | None:
        """Slots for the next tokens of each running request (one each, or `widths[i]` in a
        speculative round: the token and its drafts), for the whole batch at once: one gather
        of the last slots from the request table, one allocation, one indexed write back
        (alloc_extend per request did a scalar read, a tensor conversion and a row write
        each). Evicts from the cache if needed; None, allocating nothing, if the slots do not
        fit even then. The slots come request by request, as a ScheduledBatch lists them."""
        if not reqs:
            return torch.empty(0, dtype=torch.int64)
        pool = self.req_to_token_pool
        rows = np.fromiter((r.req_pool_idx for r in reqs), np.int64, len(reqs))
        kv_lens = np.fromiter((r.kv_len for r in reqs), np.int64, len(reqs))
        # A request with no KV yet (kv_len 0) starts fresh: -1, as alloc_extend passes.
        last_locs = pool.last_slots(rows, kv_lens)
        counts = None if widths is None else np.asarray(widths, dtype=np.int64)
        slots = self.allocator.alloc_decode(last_locs, counts)
        if slots is None:
            need = sum(
                self.tokens_needed(r, 1 if widths is None else widths[i])
                for i, r in enumerate(reqs)
            )
            self._evict(need - self.allocator.available_size())
            slots = self.allocator.alloc_decode(last_locs, counts)
            if slots is None:
                return None
        if counts is not None:
            # Each request's positions kv_len, kv_len + 1, ... in its own row.
            starts = np.cumsum(counts) - counts
            offsets = np.arange(int(counts.sum())) - np.repeat(starts, counts)
            rows = np.repeat(rows, counts)
            kv_lens = np.repeat(kv_lens, counts) + offsets
        pool.write_tokens(rows, kv_lens, slots)
        return slots

    def trim(self, req: Req, new_kv_len: int) -> None:
        """Shrink a running request's KV to its first new_kv_len positions (speculative
        decoding drops the slots of rejected drafts). Whole pages past the new end are freed;
        a partly kept page stays with the request and its unused tail is refilled by the next
        alloc_extend, which continues after the last kept slot."""
        assert req.req_pool_idx is not None and req.cached_len <= new_kv_len <= req.kv_len
        keep = -(-new_kv_len // self.page_size) * self.page_size
        if keep < req.kv_len:
            self._free(self.req_to_token_pool.read(req.req_pool_idx, keep, req.kv_len))
        req.kv_len = new_kv_len

    def _evict(self, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        freed = self.prefix_cache.evict(num_tokens)
        if len(freed):
            self.allocator.free(freed)

    def cache_unfinished(self, req: Req) -> None:
        """Put the computed, page-aligned prefix of a still-running request into the prefix
        cache (SGLang's cache_unfinished_req), so requests arriving now share it.

        Where the cache already held some of those tokens (another request computed them),
        this request's duplicate slots are freed and its table row points at the cache's.
        The request's lock moves to the new, deeper node.
        """
        if not self.prefix_cache.stores_kv or req.req_pool_idx is None:
            return
        aligned = req.kv_len // self.page_size * self.page_size
        if aligned <= req.cached_len:
            return
        slots = self.req_to_token_pool.read(req.req_pool_idx, 0, aligned)
        key = namespaced_key(req.key_ids[:aligned], req.lora_id)
        self._write_through(key, slots, req.cached_len)
        already = self.prefix_cache.insert(key, slots, priority=req.priority)
        match = self.prefix_cache.match_prefix(key, update_stats=False)
        if already > req.cached_len:
            self._free(slots[req.cached_len : already])
            self.req_to_token_pool.write(
                req.req_pool_idx, req.cached_len, match.indices[req.cached_len : already]
            )
        self.prefix_cache.inc_lock_ref(match.last_node)
        self.prefix_cache.dec_lock_ref(req.last_node)
        req.last_node = match.last_node
        req.cached_len = aligned

    # -- release ----------------------------------------------------------------------------
    def release(self, req: Req) -> None:
        """Return everything `req` holds: computed KV goes into the prefix cache (when enabled)
        so a retracted or repeated request can reuse it; the rest is freed."""
        if req.req_pool_idx is None:
            return
        for hook in self.release_hooks:
            hook(req)
        slots = self.req_to_token_pool.read(req.req_pool_idx, 0, req.kv_len)
        if self.prefix_cache.stores_kv and req.kv_len > 0:
            key = namespaced_key(req.key_ids[: req.kv_len], req.lora_id)
            self._write_through(key, slots, req.cached_len)
            prefix_len = self.prefix_cache.insert(key, slots.clone(), priority=req.priority)
            aligned = req.kv_len // self.page_size * self.page_size
            # Slots the cache already had for tokens we computed again are duplicates; the
            # unaligned tail never enters the cache.
            self._free(slots[req.cached_len : max(prefix_len, req.cached_len)])
            self._free(slots[aligned:])
        else:
            self._free(slots[req.cached_len : req.kv_len])
        self._drop_holdings(req)

    def discard(self, req: Req, num_tokens: int) -> None:
        """Free a request's first `num_tokens` slots without caching them: they were allocated
        for KV that never arrived (a PD decode whose transfer failed or was abandoned)."""
        if req.req_pool_idx is None:
            return
        for hook in self.release_hooks:
            hook(req)
        self._free(self.req_to_token_pool.read(req.req_pool_idx, req.cached_len, num_tokens))
        self._drop_holdings(req)

    def _drop_holdings(self, req: Req) -> None:
        """The end of release and discard: the cache lock, the table row and the counts."""
        self.prefix_cache.dec_lock_ref(req.last_node)
        self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx = None
        req.last_node = None
        req.kv_len = 0
        req.cached_len = 0

    def _write_through(self, key: list[int], slots: torch.Tensor, start: int) -> None:
        """--hicache-write-policy write_through: KV entering the radix cache gets a host copy
        at once (blocks ending within the already-cached `start` tokens were copied before)."""
        if self.hicache is not None and self.hicache.config.write_policy == "write_through":
            self.hicache.backup(key, slots, start)

    def _free(self, slots: torch.Tensor) -> None:
        if len(slots):
            self.allocator.free(slots)

    def flush_cache(self) -> bool:
        """Drop every cached prefix. Only allowed when no request holds KV."""
        if self.req_to_token_pool.available_size() != self.req_to_token_pool.max_reqs:
            return False
        freed = self.prefix_cache.reset()
        if len(freed):
            self.allocator.free(freed)
        if self.hicache is not None:
            self.hicache.clear_host()
        return True

    def hard_reset(self) -> None:
        """Forget every owner: only when no request is live (after a failed step). Locks held
        by the failed requests die with the tree."""
        self.prefix_cache.force_reset()
        self.allocator.clear()
        self.req_to_token_pool.clear()
        if self.hicache is not None:
            self.hicache.reset_after_failure()
        for hook in self.reset_hooks:
            hook()

    # -- accounting -------------------------------------------------------------------------
    def owned_tokens(self, reqs: Iterable[Req]) -> int:
        total = 0
        for req in reqs:
            if req.req_pool_idx is None or req.kv_len == req.cached_len:
                continue
            own = self.req_to_token_pool.read(req.req_pool_idx, req.cached_len, req.kv_len)
            total += len(torch.unique(own // self.page_size)) * self.page_size
        return total

    def check_conservation(self, live_reqs: Iterable[Req]) -> None:
        """Raise if any KV slot is lost or double counted."""
        free = self.allocator.available_size()
        cached = self.prefix_cache.total_size()
        owned = self.owned_tokens(live_reqs)
        if free + cached + owned != self.allocator.size:
            raise RuntimeError(
                f"KV conservation broken: free {free} + cached {cached} + in use {owned} "
                f"!= pool size {self.allocator.size}"
            )
