from __future__ import annotations

import pytest
import torch

from radixserve.mem_cache.allocator import TokenToKVPoolAllocator
from radixserve.mem_cache.chunk_cache import CHUNK_CACHE_NODE, ChunkCache


def test_match_is_always_empty() -> None:
    c = ChunkCache(page_size=4)
    c.insert(list(range(8)), torch.arange(8))
    m = c.match_prefix(list(range(8)))
    assert m.indices.numel() == 0 and m.indices.dtype == torch.int64
    assert m.last_node is CHUNK_CACHE_NODE


def test_insert_stores_nothing_and_sizes_stay_zero() -> None:
    c = ChunkCache()
    assert c.insert([1, 2, 3], torch.tensor([4, 5, 6])) == 0
    assert c.evictable_size() == 0 and c.protected_size() == 0 and c.total_size() == 0
    assert c.evict(10).numel() == 0
    assert c.reset().numel() == 0
    assert ChunkCache.stores_kv is False
    c.check_integrity()


def test_lock_handle_is_checked() -> None:
    c = ChunkCache()
    node = c.match_prefix([1, 2]).last_node
    c.inc_lock_ref(node)
    c.dec_lock_ref(node)
    with pytest.raises(TypeError, match="node"):
        c.inc_lock_ref(object())


def test_bad_input_names_parameter() -> None:
    c = ChunkCache()
    with pytest.raises(ValueError, match="len\\(indices\\)"):
        c.insert([1, 2], torch.tensor([1]))
    with pytest.raises(ValueError, match="num_tokens"):
        c.evict(-1)
    with pytest.raises(ValueError, match="page_size"):
        ChunkCache(page_size=0)


def test_request_lifecycle_conserves_kv() -> None:
    alloc = TokenToKVPoolAllocator(32, page_size=4)
    c = ChunkCache(page_size=4)
    seq = list(range(11))
    m = c.match_prefix(seq[:-1])
    c.inc_lock_ref(m.last_node)
    slots = alloc.alloc(len(seq) - m.indices.numel())
    assert slots is not None
    idx = torch.cat([m.indices, slots])
    prefix_len = c.insert(seq, idx)
    assert prefix_len == 0
    alloc.free(idx)  # nothing was kept, so the request frees all of it
    c.dec_lock_ref(m.last_node)
    assert alloc.available_size() + c.total_size() == 32
