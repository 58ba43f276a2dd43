from __future__ import annotations

import numpy as np
import pytest
import torch

from radixserve.mem_cache.allocator import TokenToKVPoolAllocator
from radixserve.mem_cache.radix_cache import RadixCache, _first_mismatch


def t(xs: list[int]) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64)


def test_insert_then_match_basics() -> None:
    c = RadixCache()
    assert c.insert([1, 2, 3], t([7, 8, 9])) == 0
    m = c.match_prefix([1, 2, 3, 4])
    assert m.indices.tolist() == [7, 8, 9]
    assert m.indices.dtype == torch.int64
    assert c.match_prefix([2, 3]).indices.numel() == 0
    assert c.match_prefix([]).indices.numel() == 0
    assert c.total_size() == 3 and c.evictable_size() == 3 and c.protected_size() == 0
    c.check_integrity()


def test_match_accepts_tensor_and_tuple_keys() -> None:
    c = RadixCache()
    c.insert(torch.tensor([4, 5, 6]), t([0, 1, 2]))
    assert c.match_prefix((4, 5)).indices.tolist() == [0, 1]
    assert c.match_prefix(torch.tensor([4, 5, 6])).indices.tolist() == [0, 1, 2]


def test_match_ending_mid_node_splits_it() -> None:
    c = RadixCache()
    c.insert([1, 2, 3, 4, 5], t([10, 11, 12, 13, 14]))
    m = c.match_prefix([1, 2, 3, 9])
    assert m.indices.tolist() == [10, 11, 12]
    assert m.last_node.key == [1, 2, 3]
    assert len(m.last_node.children) == 1
    (child,) = m.last_node.children.values()
    assert child.key == [4, 5] and child.value.tolist() == [13, 14]
    full = c.match_prefix([1, 2, 3, 4, 5])
    assert full.indices.tolist() == [10, 11, 12, 13, 14]
    assert full.last_node is child
    assert c.total_size() == 5
    c.check_integrity()


def test_shared_prefixes_and_insert_prefix_len() -> None:
    c = RadixCache()
    assert c.insert([1, 2, 3, 4], t([0, 1, 2, 3])) == 0
    # [1, 2] already cached: the caller's slots 10, 11 are duplicates it must free.
    assert c.insert([1, 2, 5, 6], t([10, 11, 12, 13])) == 2
    assert c.match_prefix([1, 2, 5, 6]).indices.tolist() == [0, 1, 12, 13]
    assert c.match_prefix([1, 2, 3, 4]).indices.tolist() == [0, 1, 2, 3]
    assert c.insert([1, 2, 3, 4, 7], t([20, 21, 22, 23, 24])) == 4
    assert c.insert([1, 2, 3], t([30, 31, 32])) == 3
    assert c.total_size() == 7
    c.check_integrity()


def test_insert_length_mismatch_raises() -> None:
    c = RadixCache()
    with pytest.raises(ValueError, match="len\\(indices\\)"):
        c.insert([1, 2, 3], t([1, 2]))
    with pytest.raises(TypeError, match="indices"):
        c.insert([1], [5])  # type: ignore[arg-type]
    assert c.total_size() == 0


def test_bad_construction_names_parameter() -> None:
    with pytest.raises(ValueError, match=r"eviction_policy.*lfu"):
        RadixCache(eviction_policy="bogus")
    with pytest.raises(ValueError, match="page_size"):
        RadixCache(page_size=0)


def test_lock_protects_path_and_nests() -> None:
    c = RadixCache()
    c.insert([1, 2, 3, 4], t([0, 1, 2, 3]))
    c.insert([1, 2, 5, 6], t([4, 5, 6, 7]))
    node = c.match_prefix([1, 2, 3, 4]).last_node
    c.inc_lock_ref(node)
    c.inc_lock_ref(node)
    assert c.protected_size() == 4 and c.evictable_size() == 2
    assert sorted(c.evict(100).tolist()) == [6, 7]  # only the unlocked branch goes
    c.dec_lock_ref(node)
    assert c.protected_size() == 4
    assert c.evict(100).numel() == 0
    c.dec_lock_ref(node)
    assert c.protected_size() == 0 and c.evictable_size() == 4
    with pytest.raises(RuntimeError, match="unlocked"):
        c.dec_lock_ref(node)
    assert sorted(c.evict(100).tolist()) == [0, 1, 2, 3]
    assert c.total_size() == 0
    c.check_integrity()


def test_split_of_locked_node_keeps_lock_accounting() -> None:
    c = RadixCache()
    c.insert([1, 2, 3, 4], t([0, 1, 2, 3]))
    node = c.match_prefix([1, 2, 3, 4]).last_node
    c.inc_lock_ref(node)
    c.match_prefix([1, 2, 9])  # splits the locked node
    c.check_integrity()
    assert c.protected_size() == 4
    c.dec_lock_ref(node)
    assert c.evictable_size() == 4
    c.check_integrity()


def test_evict_returns_exactly_leaf_slots() -> None:
    c = RadixCache()
    c.insert([1, 2, 3, 4], t([10, 11, 12, 13]))
    c.insert([1, 2, 5, 6, 7], t([20, 21, 22, 23, 24]))
    first = c.evict(1)  # a whole leaf goes, never a partial node
    assert sorted(first.tolist()) == [12, 13]  # LRU: the older branch
    assert c.total_size() == 5
    second = c.evict(1)
    assert sorted(second.tolist()) == [22, 23, 24]
    third = c.evict(1)  # the parent became a leaf
    assert sorted(third.tolist()) == [10, 11]
    assert c.evict(1).numel() == 0
    assert c.total_size() == 0
    c.check_integrity()


def test_evict_stops_once_enough_tokens_removed() -> None:
    c = RadixCache()
    for i in range(4):
        c.insert([i, i], t([2 * i, 2 * i + 1]))
    out = c.evict(3)
    assert out.numel() == 4 and c.total_size() == 4
    assert c.evict(0).numel() == 0
    with pytest.raises(ValueError, match="num_tokens"):
        c.evict(-1)


def _order_fixture(policy: str) -> RadixCache:
    """A=[10,11] B=[20,21] C=[30,31] D=[40,41] with distinct hits, recency and priority."""
    c = RadixCache(eviction_policy=policy)
    for key, slots, prio in (
        ([10, 11], [0, 1], 1),
        ([20, 21], [2, 3], 0),
        ([30, 31], [4, 5], 5),
        ([40, 41], [6, 7], 2),
    ):
        c.insert(key, t(slots), priority=prio)
    for _ in range(3):
        c.match_prefix([10, 11, 99])  # A: 3 hits, early
    for _ in range(2):
        c.match_prefix([30, 31, 99])  # C: 2 hits, later
    c.match_prefix([20, 21, 99])  # B: 1 hit, most recent; D: 0 hits, oldest
    return c


@pytest.mark.parametrize(
    ("policy", "order"),
    [
        ("lru", "DACB"),
        ("lfu", "DBCA"),
        ("slru", "DBAC"),
        ("priority", "BADC"),
    ],
)
def test_evict_order_per_policy(policy: str, order: str) -> None:
    c = _order_fixture(policy)
    first_slot = {0: "A", 2: "B", 4: "C", 6: "D"}
    got = ""
    while c.total_size():
        got += first_slot[min(c.evict(1).tolist())]
    assert got == order


def test_priority_is_max_propagated_on_insert() -> None:
    c = RadixCache(eviction_policy="priority")
    c.insert([1, 2, 3, 4], t([0, 1, 2, 3]), priority=1)
    c.insert([1, 2, 5, 6], t([9, 9, 4, 5]), priority=3)
    shared = c.match_prefix([1, 2]).last_node
    assert shared.priority == 3
    assert sorted(c.evict(1).tolist()) == [2, 3]  # the priority-1 branch
    assert sorted(c.evict(1).tolist()) == [4, 5]
    assert sorted(c.evict(1).tolist()) == [0, 1]


def test_page_alignment_in_insert_and_match() -> None:
    c = RadixCache(page_size=4)
    key = list(range(100, 110))
    assert c.insert(key, t(list(range(10)))) == 0
    assert c.total_size() == 8  # only two whole pages are cached
    assert c.match_prefix(key[:7]).indices.tolist() == [0, 1, 2, 3]
    assert c.match_prefix(key).indices.tolist() == list(range(8))
    # Diverging at token 6 shares just the first page: the split lands on a page boundary.
    other = [*key[:6], 1, 1]
    m = c.match_prefix(other)
    assert m.indices.tolist() == [0, 1, 2, 3]
    assert len(m.last_node.key) == 4
    assert c.insert(other, t([16, 17, 18, 19, 20, 21, 22, 23])) == 4
    assert c.match_prefix(other).indices.tolist() == [0, 1, 2, 3, 20, 21, 22, 23]
    c.check_integrity()


def test_pages_sharing_first_token_are_distinct_children() -> None:
    c = RadixCache(page_size=2)
    c.insert([1, 2], t([0, 1]))
    c.insert([1, 3], t([2, 3]))
    assert c.match_prefix([1, 3]).indices.tolist() == [2, 3]
    assert c.match_prefix([1, 2]).indices.tolist() == [0, 1]
    assert len(c.root.children) == 2
    c.check_integrity()


def test_reset_returns_everything_and_refuses_when_locked() -> None:
    c = RadixCache()
    c.insert([1, 2, 3], t([0, 1, 2]))
    c.insert([1, 4], t([7, 3]))
    node = c.match_prefix([1, 4]).last_node
    c.inc_lock_ref(node)
    with pytest.raises(RuntimeError, match="locked"):
        c.reset()
    c.dec_lock_ref(node)
    assert sorted(c.reset().tolist()) == [0, 1, 2, 3]
    assert c.total_size() == 0 and c.match_prefix([1, 2]).indices.numel() == 0
    with pytest.raises(RuntimeError, match="no longer in the tree"):
        c.inc_lock_ref(node)
    c.check_integrity()


def test_long_keys_match_exactly() -> None:
    c = RadixCache()
    base = list(range(5000))
    c.insert(base, torch.arange(5000))
    for cut in (0, 1, 17, 1023, 4999):
        probe = [*base[:cut], -1, *base[cut + 1 :]]
        assert c.match_prefix(probe).indices.numel() == cut
    c.check_integrity()


# ---- randomized property test -----------------------------------------------------------


class RefCache:
    """Reference model: page-aligned prefix tuple -> slots of its last page."""

    def __init__(self, page_size: int) -> None:
        self.ps = page_size
        self.pages: dict[tuple[int, ...], list[int]] = {}

    def match_len(self, seq: list[int]) -> int:
        n = 0
        while n + self.ps <= len(seq) and tuple(seq[: n + self.ps]) in self.pages:
            n += self.ps
        return n

    def slots(self, seq: list[int], n: int) -> list[int]:
        return [s for k in range(self.ps, n + 1, self.ps) for s in self.pages[tuple(seq[:k])]]

    def insert(self, seq: list[int], idx: list[int]) -> None:
        for k in range(self.ps, len(seq) - len(seq) % self.ps + 1, self.ps):
            self.pages.setdefault(tuple(seq[:k]), idx[k - self.ps : k])

    def remove(self, evicted: set[int]) -> None:
        gone = [k for k, v in self.pages.items() if evicted.intersection(v)]
        for k in gone:
            assert evicted.issuperset(self.pages.pop(k)), "a page was evicted partly"
        for k in self.pages:  # still prefix-closed
            assert len(k) == self.ps or k[: -self.ps] in self.pages


class Sim:
    """Requests driving a RadixCache and a real allocator, checked against RefCache."""

    def __init__(self, page_size: int, policy: str, seed: int) -> None:
        self.ps = page_size
        self.size = 48 * page_size
        self.alloc = TokenToKVPoolAllocator(self.size, page_size)
        self.cache = RadixCache(page_size, policy)
        self.ref = RefCache(page_size)
        self.rng = np.random.default_rng(seed)
        # Each running request: [seq, indices, locked_len, node]
        self.reqs: list[list] = []

    def rand_seq(self) -> list[int]:
        n = int(self.rng.integers(2, 5 * self.ps + 3))
        return [int(x) for x in self.rng.integers(0, 3, n)]

    def match(self, seq: list[int]) -> tuple[torch.Tensor, object]:
        m = self.cache.match_prefix(seq)
        n = self.ref.match_len(seq)
        assert m.indices.tolist() == self.ref.slots(seq, n)
        return m.indices, m.last_node

    def start(self) -> None:
        seq = self.rand_seq()
        prefix, node = self.match(seq[:-1])  # never the last prompt token
        self.cache.inc_lock_ref(node)
        locked = prefix.numel()
        last = int(prefix[-1]) if locked else -1
        new = self.alloc.alloc(len(seq) - locked, last)
        if new is None:
            self.alloc.free(self.evict(len(seq) - locked))
            new = self.alloc.alloc(len(seq) - locked, last)
        if new is None:
            self.cache.dec_lock_ref(node)
            return
        self.reqs.append([seq, torch.cat([prefix, new]), locked, node])

    def finish(self, i: int) -> None:
        seq, idx, locked, node = self.reqs.pop(i)
        expect = self.ref.match_len(seq)
        prefix_len = self.cache.insert(seq, idx, priority=int(self.rng.integers(0, 3)))
        assert prefix_len == expect
        self.ref.insert(seq, idx.tolist())
        aligned = len(seq) - len(seq) % self.ps
        self.alloc.free(idx[locked:prefix_len])
        self.alloc.free(idx[aligned:])
        self.cache.dec_lock_ref(node)

    def checkpoint(self, i: int) -> None:
        """Chunked-prefill style: cache what a running request has, keep running on it."""
        seq, idx, locked, node = self.reqs[i]
        prefix_len = self.cache.insert(seq, idx)
        assert prefix_len == self.ref.match_len(seq)
        self.ref.insert(seq, idx.tolist())
        self.alloc.free(idx[locked:prefix_len])
        aligned = len(seq) - len(seq) % self.ps
        cached, new_node = self.match(seq[:aligned])
        assert cached.numel() == aligned
        self.cache.inc_lock_ref(new_node)
        self.cache.dec_lock_ref(node)
        self.reqs[i] = [seq, torch.cat([cached, idx[aligned:]]), aligned, new_node]

    def evict(self, n: int) -> torch.Tensor:
        out = self.cache.evict(n)
        assert out.numel() >= n or self.cache.evictable_size() == 0
        evicted = set(out.tolist())
        assert len(evicted) == out.numel()
        for seq, _, locked, _ in self.reqs:  # nothing on a locked path may go
            assert evicted.isdisjoint(self.ref.slots(seq, locked))
        self.ref.remove(evicted)
        return out

    def check(self) -> None:
        self.cache.check_integrity()
        held = sum(-(-(len(s) - locked) // self.ps) * self.ps for s, _, locked, _ in self.reqs)
        assert self.alloc.available_size() + self.cache.total_size() + held == self.size
        assert self.cache.total_size() == len(self.ref.pages) * self.ps
        locked_pages = {
            tuple(s[:k]) for s, _, n, _ in self.reqs for k in range(self.ps, n + 1, self.ps)
        }
        assert self.cache.protected_size() == len(locked_pages) * self.ps

    def step(self) -> None:
        r = self.rng.random()
        if r < 0.35 or not self.reqs:
            self.start()
        elif r < 0.6:
            self.finish(int(self.rng.integers(len(self.reqs))))
        elif r < 0.7:
            self.checkpoint(int(self.rng.integers(len(self.reqs))))
        elif r < 0.85:
            self.match(self.rand_seq())
        elif r < 0.98:
            self.alloc.free(self.evict(int(self.rng.integers(0, 4 * self.ps))))
        elif not self.reqs:
            self.alloc.free(self.cache.reset())
            self.ref.pages.clear()


@pytest.mark.parametrize(
    ("page_size", "policy", "seed"),
    [(1, "lru", 0), (1, "lfu", 1), (2, "slru", 2), (4, "priority", 3), (4, "lru", 4)],
)
def test_random_ops_match_reference_and_conserve_kv(page_size: int, policy: str, seed: int) -> None:
    sim = Sim(page_size, policy, seed)
    for _ in range(400):
        sim.step()
        sim.check()
    while sim.reqs:
        sim.finish(0)
        sim.check()
    sim.alloc.free(sim.cache.reset())
    assert sim.alloc.available_size() == sim.size


@pytest.mark.parametrize(
    ("a", "b", "expect"),
    [
        ([], [], 0),
        ([1], [2], 0),
        ([1, 2, 3], [1, 2, 3], 3),
        ([1, 2, 3], [1, 2], 2),
        (list(range(100)), [*range(40), -1], 40),
        (list(range(100)), [*range(99), -1], 99),
    ],
)
def test_first_mismatch(a: list[int], b: list[int], expect: int) -> None:
    assert _first_mismatch(a, b) == expect
