"""Eviction orderings for the radix prefix cache (`--radix-eviction-policy`).

A policy maps an evictable leaf to a sort key; the cache evicts the leaf with the *smallest*
key first. Keys end with the node id so that ties break deterministically (creation order).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class EvictableNode(Protocol):
    """The node fields a policy may read (radix_cache.TreeNode provides them)."""

    id: int
    last_access_time: int
    creation_time: int
    hit_count: int
    priority: int


EvictionKey = tuple[int, ...]
EvictionPolicy = Callable[[EvictableNode], EvictionKey]

# A node matched at least this many times sits in SLRU's protected segment.
SLRU_PROTECTED_HITS = 2


def _lru(node: EvictableNode) -> EvictionKey:
    return (node.last_access_time, node.id)


def _lfu(node: EvictableNode) -> EvictionKey:
    # Least frequently hit first; among equally hit nodes the least recently used.
    return (node.hit_count, node.last_access_time, node.id)


def _slru(node: EvictableNode) -> EvictionKey:
    # Probation (hit at most once) is drained, LRU-ordered, before any protected node goes.
    protected = int(node.hit_count >= SLRU_PROTECTED_HITS)
    return (protected, node.last_access_time, node.id)


def _priority(node: EvictableNode) -> EvictionKey:
    return (node.priority, node.last_access_time, node.id)


EVICTION_POLICIES: dict[str, EvictionPolicy] = {
    "lru": _lru,
    "lfu": _lfu,
    "slru": _slru,
    "priority": _priority,
}


def get_eviction_policy(name: str) -> EvictionPolicy:
    """The sort-key function for `name`; raises ValueError listing the valid names."""
    try:
        return EVICTION_POLICIES[name]
    except (KeyError, TypeError):
        valid = ", ".join(sorted(EVICTION_POLICIES))
        raise ValueError(
            f"eviction_policy={name!r} is not supported; choose one of: {valid}"
        ) from None
