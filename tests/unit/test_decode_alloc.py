"""Batch-level decode slot allocation: KVManager.alloc_decode, the allocator's alloc_decode
and the request table's one indexed write give the same slots as per-request alloc_extend,
each slot once, and every page freed exactly once."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from radixserve.managers.kv_manager import KVManager
from radixserve.mem_cache.allocator import TokenToKVPoolAllocator
from radixserve.mem_cache.chunk_cache import CHUNK_CACHE_NODE, ChunkCache
from radixserve.mem_cache.req_to_token_pool import ReqToTokenPool


def make_kv(size: int, page_size: int) -> KVManager:
    return KVManager(
        TokenToKVPoolAllocator(size, page_size),
        ReqToTokenPool(8, 64),
        ChunkCache(page_size),
    )


def start(kv: KVManager, prompt_lens: list[int]) -> list[SimpleNamespace]:
    """Requests admitted with no cached prefix and their prompts' slots allocated."""
    reqs = []
    for n in prompt_lens:
        req = SimpleNamespace(req_pool_idx=None, kv_len=0, cached_len=0, last_node=None)
        assert kv.admit(req, torch.empty(0, dtype=torch.int64), CHUNK_CACHE_NODE)
        assert kv.alloc_extend(req, n) is not None
        req.kv_len = n
        reqs.append(req)
    return reqs


@pytest.mark.parametrize("page_size", [1, 4])
def test_allocator_alloc_decode_matches_one_by_one(page_size: int) -> None:
    batch = TokenToKVPoolAllocator(64, page_size)
    single = TokenToKVPoolAllocator(64, page_size)
    lasts = []
    for n in (3, 4, 1):  # page_size 4: room in the page, a full page, room again
        a, b = batch.alloc(n), single.alloc(n)
        assert torch.equal(a, b)
        lasts.append(int(a[-1]))
    lasts.append(-1)  # a sequence with nothing stored yet
    got = batch.alloc_decode(np.array(lasts))
    want = torch.cat([single.alloc(1, last) for last in lasts])
    assert torch.equal(got, want)
    assert batch.available_size() == single.available_size()


def test_allocator_alloc_decode_out_of_pages_allocates_nothing() -> None:
    alloc = TokenToKVPoolAllocator(8, 4)
    first = alloc.alloc(4)
    second = alloc.alloc(4)
    assert alloc.alloc_decode(np.array([int(first[-1]), int(second[-1])])) is None
    assert alloc.available_size() == 0
    alloc.free(first)
    # Continuing in a page with room needs no free page.
    assert alloc.alloc_decode(np.array([int(second[1])])).tolist() == [int(second[2])]


@pytest.mark.parametrize("page_size", [1, 4])
def test_decode_steps_write_rows_and_free_each_page_once(page_size: int) -> None:
    kv = make_kv(128, page_size)
    ref = make_kv(128, page_size)
    reqs = start(kv, [5, 8, 1])
    ref_reqs = start(ref, [5, 8, 1])
    table = kv.req_to_token_pool.req_to_token
    for _ in range(9):
        slots = kv.alloc_decode(reqs)
        assert slots is not None
        ref_slots = torch.cat([ref.alloc_extend(r, 1) for r in ref_reqs])
        assert torch.equal(slots, ref_slots)  # the same slots as the per-request path
        for req, slot in zip(reqs, slots.tolist(), strict=True):
            assert int(table[req.req_pool_idx, req.kv_len]) == slot
            req.kv_len += 1
        for r in ref_reqs:
            r.kv_len += 1
    rows = [table[r.req_pool_idx, : r.kv_len] for r in reqs]
    everything = torch.cat(rows)
    assert everything.unique().numel() == everything.numel()  # no slot given twice
    assert torch.equal(table, ref.req_to_token_pool.req_to_token)
    # Freeing every request's slots returns the whole pool; a double free would raise.
    for row in rows:
        kv.allocator.free(row)
    assert kv.allocator.available_size() == 128


def test_decode_alloc_failure_allocates_nothing() -> None:
    kv = make_kv(8, 4)
    reqs = start(kv, [4, 4])  # both pages full: each needs a fresh page, none is free
    before = kv.req_to_token_pool.req_to_token.clone()
    assert kv.alloc_decode(reqs) is None
    assert kv.allocator.available_size() == 0
    assert torch.equal(kv.req_to_token_pool.req_to_token, before)


def test_decode_alloc_tells_on_write_each_row() -> None:
    kv = make_kv(64, 1)
    reqs = start(kv, [2, 3])
    seen: list[tuple[int, int]] = []
    kv.req_to_token_pool.on_write = lambda row, s: seen.append((row, s))
    assert kv.alloc_decode(reqs) is not None
    assert seen == [(reqs[0].req_pool_idx, 2), (reqs[1].req_pool_idx, 3)]
