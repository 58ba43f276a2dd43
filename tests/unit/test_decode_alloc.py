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


@pytest.mark.parametrize("page_size", [1, 4])
def test_allocator_widths_match_one_by_one(page_size: int) -> None:
    """A speculative round's slots (1 + drafts per sequence) equal alloc(width, last) in order,
    whether a sequence fits the rest of its page, fills it exactly, or spills into new pages."""
    batch = TokenToKVPoolAllocator(128, page_size)
    single = TokenToKVPoolAllocator(128, page_size)
    lasts = []
    for n in (3, 4, 1, 2, 6):
        a, b = batch.alloc(n), single.alloc(n)
        assert torch.equal(a, b)
        lasts.append(int(a[-1]))
    lasts.append(-1)
    widths = [1, 9, 3, 2, 0, 5]
    got = batch.alloc_decode(np.array(lasts), np.array(widths))
    want = torch.cat([single.alloc(w, last) for w, last in zip(widths, lasts, strict=True)])
    assert torch.equal(got, want)
    assert batch.available_size() == single.available_size()


def test_allocator_widths_out_of_pages_allocates_nothing() -> None:
    alloc = TokenToKVPoolAllocator(16, 4)
    first = alloc.alloc(3)
    free_before = alloc.available_size()
    # Three pages are free; the first sequence takes its page's last slot and two pages, the
    # second (5 slots, starting fresh) two more.
    assert alloc.alloc_decode(np.array([int(first[-1]), -1]), np.array([9, 5])) is None
    assert alloc.available_size() == free_before
    with pytest.raises(ValueError, match="widths"):
        alloc.alloc_decode(np.array([int(first[-1])]), np.array([1, 2]))


@pytest.mark.parametrize("page_size", [1, 4])
def test_speculative_round_slots_match_alloc_extend(page_size: int) -> None:
    """KVManager.alloc_decode with widths writes each request's row at kv_len.. kv_len+w-1,
    the same table and slots as alloc_extend request by request."""
    kv = make_kv(256, page_size)
    ref = make_kv(256, page_size)
    reqs = start(kv, [5, 8, 1])
    ref_reqs = start(ref, [5, 8, 1])
    for widths in ([3, 1, 9], [1, 1, 1], [5, 2, 4]):
        slots = kv.alloc_decode(reqs, widths)
        assert slots is not None
        want = torch.cat([ref.alloc_extend(r, w) for r, w in zip(ref_reqs, widths, strict=True)])
        assert torch.equal(slots, want)
        assert torch.equal(kv.req_to_token_pool.req_to_token, ref.req_to_token_pool.req_to_token)
        # Keep one token per request, as a round that accepted no drafts does.
        for r, r2, w in zip(reqs, ref_reqs, widths, strict=True):
            kept = r.kv_len + 1
            r.kv_len += w
            r2.kv_len += w
            kv.trim(r, kept)
            ref.trim(r2, kept)
        assert kv.allocator.available_size() == ref.allocator.available_size()


def test_table_gather_and_write_check_rows_and_positions() -> None:
    """ReqToTokenPool.last_slots / write_tokens: the decode step's one gather and one write,
    numpy-indexed, refusing rows not held and positions outside the table."""
    pool = ReqToTokenPool(4, 16)
    a, b = pool.alloc(), pool.alloc()
    assert a is not None and b is not None
    pool.write(a, 0, torch.tensor([7, 8, 9]))
    rows = np.array([a, b])
    assert pool.last_slots(rows, np.array([3, 0])).tolist() == [9, -1]
    pool.write_tokens(rows, np.array([3, 0]), torch.tensor([10, 20]))
    assert pool.req_to_token[a, :4].tolist() == [7, 8, 9, 10]
    assert int(pool.req_to_token[b, 0]) == 20
    with pytest.raises(RuntimeError, match="not allocated"):
        pool.write_tokens(np.array([a, 3]), np.array([4, 0]), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="req_pool_idx must be in"):
        pool.last_slots(np.array([4]), np.array([1]))
    with pytest.raises(ValueError, match="max_context_len"):
        pool.write_tokens(np.array([a]), np.array([16]), torch.tensor([1]))
    with pytest.raises(ValueError, match="one length"):
        pool.write_tokens(np.array([a, b]), np.array([5]), torch.tensor([1, 2]))
    assert pool.req_to_token[a, :5].tolist() == [7, 8, 9, 10, 0]  # the refused writes wrote nothing
