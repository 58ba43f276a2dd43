"""The radix-tree prefix cache: token prefixes -> KV slots, shared between requests."""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import torch

from radixserve.mem_cache.allocator import as_int_arg
from radixserve.mem_cache.base_prefix_cache import (
    BasePrefixCache,
    MatchResult,
    as_index_tensor,
    as_token_list,
)
from radixserve.mem_cache.evict_policy import get_eviction_policy

logger = logging.getLogger(__name__)


@dataclass(eq=False, slots=True)
class TreeNode:
    """One edge of the radix tree: a run of tokens and the KV slots holding them.

    `lock_ref` counts the locks taken on this node or any descendant (a lock covers the whole
    path to the root), so a parent's lock_ref is at least the sum of its children's. Identity
    equality: nodes are handles and live in sets.
    """

    id: int
    key: list[int]
    value: torch.Tensor
    parent: TreeNode | None
    children: dict[Hashable, TreeNode] = field(default_factory=dict)
    lock_ref: int = 0
    last_access_time: int = 0
    creation_time: int = 0
    hit_count: int = 0
    priority: int = 0

    def __repr__(self) -> str:
        head = self.key[:4]
        more = "..." if len(self.key) > 4 else ""
        return (
            f"TreeNode(id={self.id}, len={len(self.key)}, key={head}{more}, lock={self.lock_ref})"
        )


class RadixCache(BasePrefixCache):
    """Radix tree over token ids whose edges carry KV-pool slots.

    Invariants (checked by `check_integrity`):
      * every non-root node has a non-empty key whose length is a multiple of page_size, and as
        many slots as tokens; children are keyed by their first token (page_size 1) or first
        page as a tuple, so siblings never share a first page;
      * evictable_size() + protected_size() == tokens in the tree; a node counts as protected
        exactly while its lock_ref > 0;
      * the evictable-leaf set holds exactly the childless, unlocked, non-root nodes;
      * no KV slot appears twice in the tree.
    Access order uses a monotonic counter (one tick per match/insert), not wall time, so
    eviction order is deterministic.
    """

    def __init__(
        self,
        page_size: int = 1,
        eviction_policy: str = "lru",
        device: str | torch.device = "cpu",
    ) -> None:
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be a positive int, got {page_size!r}")
        self.page_size = page_size
        self.eviction_policy = eviction_policy
        self._policy = get_eviction_policy(eviction_policy)
        # Only the device of empty results; stored slots keep the device they came in on.
        self.device = torch.device(device)
        self._clock = 0
        self._next_id = 0
        # Called with (path tokens, path slots, leaf start) just before a leaf is evicted, while
        # its slots still hold its KV: the hierarchical cache's write-back hook.
        self.evict_listener: Callable[[list[int], torch.Tensor, int], None] | None = None
        self._init_tree()

    # ---- public API -------------------------------------------------------------------

    def match_prefix(self, key: Sequence[int], *, update_stats: bool = True) -> MatchResult:
        """Longest cached page-aligned prefix of `key`; see BasePrefixCache.match_prefix.

        Never pass a request's last prompt token: its logits must be computed, so callers
        match `input_ids[:-1]` at most.
        """
        tokens = self._aligned(as_token_list(key))
        if not tokens:
            return MatchResult(self._empty(), self.root)
        node, parts, _, path = self._descend(tokens, self._tick() if update_stats else None)
        if update_stats:
            for n in path:
                n.hit_count += 1
        return MatchResult(self._concat(parts), node)

    def insert(self, key: Sequence[int], indices: torch.Tensor, priority: int | None = 0) -> int:
        """Cache the page-aligned part of `key`; returns the length that was already cached.

        The cache takes ownership of indices[prefix_len:aligned_len]; the caller frees the rest
        it does not keep (see BasePrefixCache). `priority` (None means 0) is max-propagated
        along the path so a shared prefix keeps its most important user's priority.
        """
        tokens = as_token_list(key)
        idx = as_index_tensor(indices, len(tokens))
        prio = 0 if priority is None else as_int_arg("priority", priority)
        tokens = self._aligned(tokens)
        if not tokens:
            return 0
        now = self._tick()
        node, _, prefix_len, path = self._descend(tokens, now)
        for n in path:
            n.priority = max(n.priority, prio)
        if prefix_len < len(tokens):
            self._add_leaf(node, tokens[prefix_len:], idx[prefix_len : len(tokens)], prio, now)
        return prefix_len

    def inc_lock_ref(self, node: TreeNode) -> None:
        self._check_handle(node, "inc_lock_ref")
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
                self._evictable_leaves.discard(node)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def dec_lock_ref(self, node: TreeNode) -> None:
        self._check_handle(node, "dec_lock_ref")
        if node is not self.root and node.lock_ref <= 0:
            raise RuntimeError(f"dec_lock_ref on unlocked node {node!r}")
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._protected -= len(node.key)
                self._evictable += len(node.key)
                if not node.children:
                    self._evictable_leaves.add(node)
            node = node.parent  # type: ignore[assignment]

    def evict(self, num_tokens: int) -> torch.Tensor:
        num_tokens = as_int_arg("num_tokens", num_tokens)
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        heap = [(self._policy(leaf), leaf) for leaf in self._evictable_leaves]
        heapq.heapify(heap)
        removed: list[torch.Tensor] = []
        freed = 0
        # Policy keys end with the unique node id, so tuples never fall through to nodes.
        while freed < num_tokens and heap:
            _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            if self.evict_listener is not None:
                tokens, slots = self._path(leaf)
                self.evict_listener(tokens, slots, len(tokens) - len(leaf.key))
            self._remove_leaf(leaf)
            removed.append(leaf.value)
            freed += len(leaf.key)
            if parent in self._evictable_leaves:
                heapq.heappush(heap, (self._policy(parent), parent))
        if freed:
            logger.debug("evicted %d tokens (asked %d)", freed, num_tokens)
        return self._concat(removed)

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def reset(self) -> torch.Tensor:
        if self._protected > 0:
            raise RuntimeError(f"reset while {self._protected} cached tokens are locked")
        values: list[torch.Tensor] = []
        for node in self._iter_nodes():
            values.append(node.value)
            node.parent = None  # stale handles now fail loudly instead of corrupting counts
        self._init_tree()
        return self._concat(values)

    def _drop_all(self) -> None:
        for node in self._iter_nodes():
            node.parent = None
        self._init_tree()

    def check_integrity(self) -> None:
        evictable = protected = 0
        leaves: set[TreeNode] = set()
        values: list[torch.Tensor] = []
        for node in self._iter_nodes():
            self._check_node(node)
            if node.lock_ref > 0:
                protected += len(node.key)
            else:
                evictable += len(node.key)
                if not node.children:
                    leaves.add(node)
            values.append(node.value)
        _require(evictable == self._evictable, f"evictable {self._evictable} != {evictable}")
        _require(protected == self._protected, f"protected {self._protected} != {protected}")
        _require(leaves == self._evictable_leaves, "evictable-leaf set out of date")
        slots = self._concat(values)
        _require(torch.unique(slots).numel() == slots.numel(), "a KV slot is cached twice")

    # ---- tree mechanics ---------------------------------------------------------------

    def _init_tree(self) -> None:
        self.root = self._new_node([], self._empty(), None, 0)
        self._evictable = 0
        self._protected = 0
        self._evictable_leaves: set[TreeNode] = set()

    def _new_node(
        self, key: list[int], value: torch.Tensor, parent: TreeNode | None, now: int
    ) -> TreeNode:
        self._next_id += 1
        return TreeNode(
            id=self._next_id,
            key=key,
            value=value,
            parent=parent,
            last_access_time=now,
            creation_time=now,
        )

    def _descend(
        self, key: list[int], now: int | None
    ) -> tuple[TreeNode, list[torch.Tensor], int, list[TreeNode]]:
        """Walk from the root along page-aligned `key`, splitting a node the match ends inside.

        Stamps `now` (unless None) on every node on the matched path. Returns (deepest matched node, their
        slot tensors, matched length, the matched nodes).
        """
        node, pos = self.root, 0
        parts: list[torch.Tensor] = []
        path: list[TreeNode] = []
        while pos < len(key):
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                break
            n = self._match_len(child.key, key, pos)
            partial = n < len(child.key)
            if partial:
                child = self._split(child, n)
            if now is not None:
                child.last_access_time = now
            parts.append(child.value)
            path.append(child)
            node, pos = child, pos + n
            if partial:
                break
        return node, parts, pos, path

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut `child` after n tokens: a new parent takes the prefix, child keeps the suffix.

        The new node inherits lock_ref (every lock through child passes through it), hit count,
        priority and times, so sizes and the evictable-leaf set do not change.
        """
        parent = child.parent
        assert parent is not None
        new = self._new_node(child.key[:n], child.value[:n].clone(), parent, child.creation_time)
        new.lock_ref = child.lock_ref
        new.hit_count = child.hit_count
        new.priority = child.priority
        new.last_access_time = child.last_access_time
        parent.children[self._child_key(new.key, 0)] = new
        child.key = child.key[n:]
        child.value = child.value[n:].clone()
        child.parent = new
        new.children[self._child_key(child.key, 0)] = child
        return new

    def _add_leaf(
        self, parent: TreeNode, key: list[int], value: torch.Tensor, priority: int, now: int
    ) -> None:
        leaf = self._new_node(key, value.clone(), parent, now)
        leaf.priority = priority
        parent.children[self._child_key(key, 0)] = leaf
        self._evictable_leaves.discard(parent)
        self._evictable += len(key)
        self._evictable_leaves.add(leaf)

    def _remove_leaf(self, leaf: TreeNode) -> None:
        parent = leaf.parent
        assert parent is not None and not leaf.children and leaf.lock_ref == 0
        del parent.children[self._child_key(leaf.key, 0)]
        self._evictable_leaves.discard(leaf)
        self._evictable -= len(leaf.key)
        leaf.parent = None
        if parent is not self.root and not parent.children and parent.lock_ref == 0:
            self._evictable_leaves.add(parent)

    def _path(self, node: TreeNode) -> tuple[list[int], torch.Tensor]:
        """Tokens and slots from the root down to the end of `node`."""
        keys: list[list[int]] = []
        values: list[torch.Tensor] = []
        while node is not self.root:
            keys.append(node.key)
            values.append(node.value)
            node = node.parent  # type: ignore[assignment]
        tokens = [t for key in reversed(keys) for t in key]
        return tokens, self._concat(values[::-1])

    def _child_key(self, key: list[int], pos: int) -> Hashable:
        if self.page_size == 1:
            return key[pos]
        return tuple(key[pos : pos + self.page_size])

    def _match_len(self, node_key: list[int], key: list[int], pos: int) -> int:
        """Common prefix length of node_key and key[pos:], rounded down to page_size."""
        seg = key[pos : pos + len(node_key)]
        if seg == node_key:
            return len(seg)
        n = _first_mismatch(node_key, seg)
        return n - n % self.page_size

    def _check_handle(self, node: object, op: str) -> None:
        if not isinstance(node, TreeNode):
            raise TypeError(f"{op}: node must be a TreeNode, got {type(node).__name__}")
        if node is not self.root and node.parent is None:
            raise RuntimeError(f"{op}: {node!r} is no longer in the tree (evicted or reset)")

    def _check_node(self, node: TreeNode) -> None:
        parent = node.parent
        _require(parent is not None, f"{node!r} has no parent")
        assert parent is not None
        _require(len(node.key) > 0, f"{node!r} has an empty key")
        _require(len(node.key) % self.page_size == 0, f"{node!r} key is not page-aligned")
        _require(node.value.numel() == len(node.key), f"{node!r} has {node.value.numel()} slots")
        _require(parent.children.get(self._child_key(node.key, 0)) is node, f"{node!r} misfiled")
        _require(node.lock_ref >= 0, f"{node!r} has a negative lock_ref")
        child_locks = sum(c.lock_ref for c in node.children.values())
        _require(node.lock_ref >= child_locks, f"{node!r} lock_ref below its children's")
        if self.page_size > 1:
            pages = node.value.view(-1, self.page_size)
            ok = bool((pages[:, 0] % self.page_size == 0).all()) and bool(
                (pages[:, 1:] - pages[:, :-1] == 1).all()
            )
            _require(ok, f"{node!r} holds slots that are not whole pages")

    def _iter_nodes(self) -> list[TreeNode]:
        """Every non-root node, parents before children."""
        out: list[TreeNode] = []
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def _aligned(self, tokens: list[int]) -> list[int]:
        extra = len(tokens) % self.page_size
        return tokens[: len(tokens) - extra] if extra else tokens

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _empty(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.int64, device=self.device)

    def _concat(self, parts: list[torch.Tensor]) -> torch.Tensor:
        if not parts:
            return self._empty()
        return parts[0].clone() if len(parts) == 1 else torch.cat(parts)


def _first_mismatch(a: list[int], b: list[int]) -> int:
    """Index of the first position where a and b differ (or the shorter length).

    Galloping: compare doubling blocks with C-speed list equality, then binary-search the block
    that differs, so long shared prefixes cost no Python loop per token.
    """
    n = min(len(a), len(b))
    lo, step = 0, 16
    while lo < n:
        hi = min(lo + step, n)
        if a[lo:hi] != b[lo:hi]:
            while hi - lo > 1:  # the first mismatch lies in [lo, hi)
                mid = (lo + hi) // 2
                if a[lo:mid] == b[lo:mid]:
                    lo = mid
                else:
                    hi = mid
            return lo
        lo, step = hi, step * 2
    return n


def _require(cond: bool, message: str) -> None:
    # Explicit raise rather than `assert`, which python -O would strip from integrity checks.
    if not cond:
        raise AssertionError(message)
