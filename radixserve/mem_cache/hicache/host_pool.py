"""The host tier: a pool of KV blocks in host memory, indexed by chained block hash (LRU).

Layout "page_first": data[block, layer, k/v, token, head, dim], so one block is one contiguous
run of memory (one file on disk, one copy in or out). On a CPU server "host" and "device" are
both main memory; the host pool is the larger, cheaper tier that outlives device eviction.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import torch

logger = logging.getLogger(__name__)


class HostKVPool:
    """`num_blocks` blocks of `block_tokens` tokens; a block is free or holds one hash.

    Invariants: every block id is either on the free list or the value of exactly one index
    entry; pinned blocks (being loaded back) are never evicted.
    """

    def __init__(
        self,
        num_blocks: int,
        block_tokens: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_tokens = block_tokens
        self.dtype = dtype
        # torch.empty: memory is committed only as blocks are written.
        self.data = torch.empty(
            (num_blocks, num_layers, 2, block_tokens, num_kv_heads, head_dim), dtype=dtype
        )
        self._index: OrderedDict[str, int] = OrderedDict()  # oldest first
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._pins: dict[int, int] = {}

    @property
    def block_shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape[1:])

    def used_blocks(self) -> int:
        return len(self._index)

    def contains(self, key: str) -> bool:
        return key in self._index

    def lookup(self, key: str) -> int | None:
        """The block holding `key` (marked most recently used), or None."""
        block = self._index.get(key)
        if block is not None:
            self._index.move_to_end(key)
        return block

    def allocate(self, key: str) -> int | None:
        """A block for `key`, evicting the least recently used unpinned one if the pool is
        full; None if every block is pinned. The caller fills `data[block]`."""
        if key in self._index:
            raise ValueError(f"host block {key[:12]} already cached")
        if not self._free and not self._evict_one():
            return None
        block = self._free.pop()
        self._index[key] = block
        return block

    def pin(self, block: int) -> None:
        self._pins[block] = self._pins.get(block, 0) + 1

    def unpin(self, block: int) -> None:
        left = self._pins[block] - 1
        if left:
            self._pins[block] = left
        else:
            del self._pins[block]

    def clear(self, force: bool = False) -> None:
        if self._pins and not force:
            raise RuntimeError("host pool cleared while blocks are pinned")
        self._pins.clear()
        self._index.clear()
        self._free = list(range(self.num_blocks - 1, -1, -1))

    def _evict_one(self) -> bool:
        for key, block in self._index.items():
            if block not in self._pins:
                del self._index[key]
                self._free.append(block)
                logger.debug("host tier evicted block %s", key[:12])
                return True
        return False
