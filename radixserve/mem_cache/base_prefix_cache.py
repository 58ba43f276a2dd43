"""The prefix-cache interface the scheduler talks to (radix tree or no-sharing chunk cache)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

import torch


class MatchResult(NamedTuple):
    """What `match_prefix` found."""

    # int64 KV slots of the matched prefix; its length is a multiple of page_size.
    indices: torch.Tensor
    # Handle to pass to inc_lock_ref / dec_lock_ref (a TreeNode; for ChunkCache a sentinel).
    last_node: Any


class BasePrefixCache(ABC):
    """A cache from token prefixes to the KV slots that hold their keys and values.

    Ownership protocol (the cache never touches the allocator or the KV tensors):
      * `match_prefix` returns slots the cache owns; a request that uses them must
        `inc_lock_ref(last_node)` before anything may evict, and `dec_lock_ref` when done.
      * `insert(key, indices)` returns prefix_len, the leading tokens already cached. The cache
        takes ownership of indices[prefix_len:aligned_len] (aligned_len = len(key) rounded down
        to page_size). The caller frees its duplicates indices[locked_len:prefix_len] (locked_len:
        the prefix it had matched and locked, whose slots were the cache's own) and the
        unaligned tail indices[aligned_len:].
      * `evict` and `reset` hand removed slots back to the caller, who frees them.
    Conservation: allocator free + total_size() + slots held by requests == pool size.

    `stores_kv` is False for caches that keep nothing (ChunkCache): insert returns 0 and the
    caller frees every slot it passed, aligned part included.
    """

    stores_kv: ClassVar[bool] = True
    page_size: int

    @abstractmethod
    def match_prefix(self, key: Sequence[int], *, update_stats: bool = True) -> MatchResult:
        """Longest cached prefix of `key`, page-aligned.

        Splits a node if the match ends inside it and, unless `update_stats` is False (a look
        for ordering the queue, not a use), updates access time and hit counts along the
        matched path. The CALLER must never pass a request's last prompt token: that token's
        logits have to be computed, so match `input_ids[:-1]` (or shorter), never the full prompt.
        """

    @abstractmethod
    def insert(self, key: Sequence[int], indices: torch.Tensor, priority: int = 0) -> int:
        """Cache the first floor(len(key) / page_size) * page_size tokens of `key`.

        len(indices) must equal len(key). Returns how many leading tokens of `key` were already
        cached before this call; see the class docstring for who frees what afterwards.
        """

    @abstractmethod
    def inc_lock_ref(self, node: Any) -> None:
        """Protect `node` and all its ancestors from eviction; locks nest."""

    @abstractmethod
    def dec_lock_ref(self, node: Any) -> None:
        """Undo one `inc_lock_ref(node)`."""

    @abstractmethod
    def evict(self, num_tokens: int) -> torch.Tensor:
        """Remove unlocked leaves until >= num_tokens tokens went or nothing is evictable.

        Returns the removed KV slots (int64, 1-D) for the caller to free in the allocator.
        """

    @abstractmethod
    def evictable_size(self) -> int:
        """Tokens cached in nodes that no lock protects."""

    @abstractmethod
    def protected_size(self) -> int:
        """Tokens cached in locked nodes (on a path some request holds)."""

    def total_size(self) -> int:
        """All tokens the cache holds."""
        return self.evictable_size() + self.protected_size()

    @abstractmethod
    def reset(self) -> torch.Tensor:
        """Drop everything and return every slot held; raises RuntimeError if a lock is held."""

    def force_reset(self) -> None:
        """Drop everything, locks included, without returning slots: for recovery after a
        failure, when the caller resets the allocator too."""
        self._drop_all()

    @abstractmethod
    def _drop_all(self) -> None:
        """Forget every node and lock."""

    @abstractmethod
    def check_integrity(self) -> None:
        """Raise AssertionError if an internal invariant is broken (for tests and debugging)."""


def as_token_list(key: Sequence[int] | torch.Tensor) -> list[int]:
    """`key` as a list of Python ints (accepts lists, tuples, tensors and numpy arrays)."""
    if isinstance(key, list):
        return key
    tolist = getattr(key, "tolist", None)
    if tolist is not None:
        out = tolist()
        if not isinstance(out, list):
            raise ValueError(f"key must be 1-D, got a scalar {key!r}")
        return out
    if isinstance(key, str | bytes):
        raise TypeError(f"key must be a sequence of token ids, got {type(key).__name__}")
    return list(key)


def as_index_tensor(indices: torch.Tensor, expected_len: int) -> torch.Tensor:
    """Validate insert's `indices`: a 1-D integer tensor as long as the key, as int64."""
    if not isinstance(indices, torch.Tensor):
        raise TypeError(f"indices must be a torch.Tensor, got {type(indices).__name__}")
    if indices.dim() != 1:
        raise ValueError(f"indices must be 1-D, got shape {tuple(indices.shape)}")
    if indices.dtype.is_floating_point or indices.dtype == torch.bool:
        raise ValueError(f"indices must be an integer tensor, got dtype {indices.dtype}")
    if indices.numel() != expected_len:
        raise ValueError(f"len(indices) ({indices.numel()}) must equal len(key) ({expected_len})")
    return indices.to(torch.int64)
