from __future__ import annotations

import numpy as np
import pytest
import torch

from radixserve.mem_cache.allocator import TokenToKVPoolAllocator


def test_alloc_free_round_trip_page1() -> None:
    a = TokenToKVPoolAllocator(8)
    assert a.available_size() == 8
    s = a.alloc(5)
    assert s is not None
    assert s.dtype == torch.int64 and s.dim() == 1
    assert sorted(s.tolist()) == [0, 1, 2, 3, 4]
    assert a.available_size() == 3
    t = a.alloc(3)
    assert t is not None
    assert set(s.tolist()).isdisjoint(t.tolist())
    assert a.available_size() == 0
    a.free(s)
    assert a.available_size() == 5
    u = a.alloc(5)
    assert u is not None and sorted(u.tolist()) == sorted(s.tolist())
    a.free(torch.cat([t, u]))
    assert a.available_size() == 8


def test_alloc_zero_gives_empty_tensor() -> None:
    a = TokenToKVPoolAllocator(8, page_size=4)
    s = a.alloc(0)
    assert s is not None and s.numel() == 0 and s.dtype == torch.int64
    assert a.available_size() == 8


def test_out_of_memory_returns_none_and_allocates_nothing() -> None:
    a = TokenToKVPoolAllocator(8, page_size=2)
    first = a.alloc(5)  # 3 pages
    assert first is not None
    assert a.available_size() == 2
    assert a.alloc(3) is None
    assert a.available_size() == 2
    # Continuation needs 1 slot in the tail of first's page plus 2 new pages: too many.
    assert a.alloc(6, last_loc=int(first[-1])) is None
    assert a.available_size() == 2
    # ...but fitting the tail plus one page works.
    more = a.alloc(3, last_loc=int(first[-1]))
    assert more is not None and more.tolist()[0] == int(first[-1]) + 1
    assert a.available_size() == 0


def test_double_free_raises_and_frees_nothing() -> None:
    a = TokenToKVPoolAllocator(8)
    s = a.alloc(4)
    assert s is not None
    a.free(s[:2])
    with pytest.raises(RuntimeError, match="double free"):
        a.free(s)  # s[:2] already free: the whole call must be rejected
    assert a.available_size() == 6
    a.free(s[2:])
    assert a.available_size() == 8


def test_free_out_of_range_raises() -> None:
    a = TokenToKVPoolAllocator(8)
    with pytest.raises(ValueError, match="out of range"):
        a.free(torch.tensor([8]))
    with pytest.raises(ValueError, match="out of range"):
        a.free(torch.tensor([-1]))


def test_page_alloc_returns_whole_pages_in_order() -> None:
    a = TokenToKVPoolAllocator(16, page_size=4)
    s = a.alloc(6)
    assert s is not None
    assert s.tolist() == [0, 1, 2, 3, 4, 5]
    assert a.available_size() == 8  # two pages taken, the second only partly used
    pages = {x // 4 for x in s.tolist()}
    assert len(pages) == 2


def test_page_continuation_fills_last_page_first() -> None:
    a = TokenToKVPoolAllocator(16, page_size=4)
    s = a.alloc(6)
    assert s is not None
    t = a.alloc(5, last_loc=int(s[-1]))
    assert t is not None
    # Slots 6, 7 finish page 1, then one new page supplies the other three.
    assert t.tolist()[:2] == [6, 7]
    rest = t.tolist()[2:]
    assert len(rest) == 3 and rest[0] % 4 == 0 and rest == list(range(rest[0], rest[0] + 3))
    assert a.available_size() == 4


def test_continuation_at_page_end_takes_new_page() -> None:
    a = TokenToKVPoolAllocator(16, page_size=4)
    s = a.alloc(4)
    assert s is not None
    t = a.alloc(1, last_loc=3)
    assert t is not None and t.item() % 4 == 0 and t.item() // 4 != 0
    assert a.available_size() == 8


def test_continuation_within_page_needs_no_new_page() -> None:
    a = TokenToKVPoolAllocator(8, page_size=4)
    s = a.alloc(1)
    assert s is not None
    t = a.alloc(2, last_loc=int(s[0]))
    assert t is not None and t.tolist() == [int(s[0]) + 1, int(s[0]) + 2]
    assert a.available_size() == 4


def test_page_free_frees_each_page_once() -> None:
    a = TokenToKVPoolAllocator(16, page_size=4)
    s = a.alloc(6)
    assert s is not None
    a.free(s)  # six slots, two pages
    assert a.available_size() == 16
    with pytest.raises(RuntimeError, match="double free"):
        a.free(s[:1])


def test_last_loc_in_free_page_raises() -> None:
    a = TokenToKVPoolAllocator(16, page_size=4)
    with pytest.raises(RuntimeError, match="free"):
        a.alloc(2, last_loc=5)


def test_clear_frees_everything() -> None:
    a = TokenToKVPoolAllocator(12, page_size=3)
    assert a.alloc(7) is not None
    a.clear()
    assert a.available_size() == 12
    s = a.alloc(12)
    assert s is not None and sorted(s.tolist()) == list(range(12))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"size": 10, "page_size": 4}, "multiple"),
        ({"size": 0}, "size"),
        ({"size": 8, "page_size": 0}, "page_size"),
    ],
)
def test_bad_construction_names_parameter(kwargs: dict[str, int], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        TokenToKVPoolAllocator(**kwargs)


def test_bad_alloc_args_name_parameter() -> None:
    a = TokenToKVPoolAllocator(8, page_size=2)
    with pytest.raises(ValueError, match="num_tokens"):
        a.alloc(-1)
    with pytest.raises(ValueError, match="num_tokens"):
        a.alloc(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="last_loc"):
        a.alloc(1, last_loc=8)


def test_accepts_int_like_arguments() -> None:
    a = TokenToKVPoolAllocator(8, page_size=2)
    s = a.alloc(np.int64(3))  # type: ignore[arg-type]
    assert s is not None
    t = a.alloc(1, last_loc=s[-1])  # type: ignore[arg-type]
    assert t is not None and t.item() == int(s[-1]) + 1


def test_random_alloc_free_conserves_pages() -> None:
    gen = np.random.default_rng(0)
    ps = 4
    a = TokenToKVPoolAllocator(64, page_size=ps)
    held: list[torch.Tensor] = []
    for _ in range(300):
        if held and gen.random() < 0.45:
            a.free(held.pop(int(gen.integers(len(held)))))
        else:
            n = int(gen.integers(0, 20))
            s = a.alloc(n)
            if s is None:
                assert -(-n // ps) * ps > a.available_size()
                continue
            assert s.numel() == n
            held.append(s)
        used_pages = {x // ps for h in held for x in h.tolist()}
        assert a.available_size() + len(used_pages) * ps == 64
        all_slots = [x for h in held for x in h.tolist()]
        assert len(all_slots) == len(set(all_slots))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_slots_round_trip_through_radix_cache() -> None:
    from radixserve.mem_cache.radix_cache import RadixCache

    a = TokenToKVPoolAllocator(16, page_size=4, device="cuda")
    c = RadixCache(page_size=4, device="cuda")
    s = a.alloc(6)
    assert s is not None and s.device.type == "cuda"
    more = a.alloc(1, last_loc=s[-1])  # type: ignore[arg-type]
    assert more is not None and more.item() == int(s[-1]) + 1
    idx = torch.cat([s, more])
    assert c.insert(list(range(7)), idx) == 0
    a.free(idx[4:])  # the unaligned tail stays with the "request"
    m = c.match_prefix(list(range(7)))
    assert m.indices.device.type == "cuda" and m.indices.tolist() == s[:4].tolist()
    assert c.match_prefix([99]).indices.device.type == "cuda"
    a.free(c.evict(4))
    assert a.available_size() == 16
