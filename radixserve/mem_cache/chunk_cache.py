"""The no-sharing prefix cache used with --disable-radix-cache."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from radixserve.mem_cache.allocator import as_int_arg
from radixserve.mem_cache.base_prefix_cache import (
    BasePrefixCache,
    MatchResult,
    as_index_tensor,
    as_token_list,
)


class _NoNode:
    """The lock handle ChunkCache hands out: locking it protects nothing, because nothing is
    cached."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "CHUNK_CACHE_NODE"


CHUNK_CACHE_NODE: Any = _NoNode()


class ChunkCache(BasePrefixCache):
    """A prefix cache that caches nothing: every request keeps and frees its own KV slots.

    match_prefix always returns no slots (and CHUNK_CACHE_NODE as the handle), insert stores
    nothing and returns 0, so after insert the caller frees every slot it passed. Sizes are 0.
    Inputs are still validated so a caller bug surfaces the same way as with RadixCache.
    """

    stores_kv: ClassVar[bool] = False

    def __init__(self, page_size: int = 1, device: str | torch.device = "cpu") -> None:
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be a positive int, got {page_size!r}")
        self.page_size = page_size
        self.device = torch.device(device)

    def match_prefix(self, key: Sequence[int], *, update_stats: bool = True) -> MatchResult:
        """Always an empty match (the caller still must not pass the last prompt token)."""
        as_token_list(key)
        return MatchResult(self._empty(), CHUNK_CACHE_NODE)

    def insert(self, key: Sequence[int], indices: torch.Tensor, priority: int | None = 0) -> int:
        """Stores nothing; returns 0 so that the caller frees all of `indices`."""
        as_index_tensor(indices, len(as_token_list(key)))
        return 0

    def inc_lock_ref(self, node: Any) -> None:
        self._check_handle(node, "inc_lock_ref")

    def dec_lock_ref(self, node: Any) -> None:
        self._check_handle(node, "dec_lock_ref")

    def evict(self, num_tokens: int) -> torch.Tensor:
        if as_int_arg("num_tokens", num_tokens) < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        return self._empty()

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def reset(self) -> torch.Tensor:
        return self._empty()

    def _drop_all(self) -> None:
        """Nothing is stored."""

    def check_integrity(self) -> None:
        """Nothing is stored, so there is nothing that could be inconsistent."""

    def _empty(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.int64, device=self.device)

    @staticmethod
    def _check_handle(node: Any, op: str) -> None:
        if node is not CHUNK_CACHE_NODE:
            raise TypeError(f"{op}: node must be the handle ChunkCache.match_prefix returned")
