"""Moves KV blocks between the device pool, the host pool and the disk tier.

The radix cache keeps indexing device slots only; this controller is the one place that copies
KV tensors between tiers. KVManager calls it: `backup` when device KV should gain a host copy
(per write policy), `find` + `load` when a request's prefix continues past the device match in
a lower tier.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple

import torch

from radixserve.mem_cache.hicache.block_hash import block_hashes, identity_seed
from radixserve.mem_cache.hicache.config import HiCacheConfig
from radixserve.mem_cache.hicache.file_storage import FileStorage
from radixserve.mem_cache.hicache.host_memory import check_host_tier_fits
from radixserve.mem_cache.hicache.host_pool import HostKVPool
from radixserve.mem_cache.kv_cache import KVCache

logger = logging.getLogger(__name__)


class LoadPlan(NamedTuple):
    """Host blocks (pinned) that continue a device match, in prefix order."""

    blocks: list[int]
    offset: int  # leading tokens of blocks[0] the device already holds
    host_tokens: int  # tokens found in host memory
    storage_tokens: int  # tokens read from disk (now in host memory too)

    @property
    def tokens(self) -> int:
        return self.host_tokens + self.storage_tokens


EMPTY_PLAN = LoadPlan([], 0, 0, 0)


@dataclass
class HiCacheStats:
    host_hit_tokens: int = 0
    storage_hit_tokens: int = 0
    backed_up_blocks: int = 0
    loaded_blocks: int = 0


class HiCacheController:
    def __init__(self, config: HiCacheConfig, kv_cache: KVCache, identity: str) -> None:
        self.config = config
        self.kv = kv_cache
        self.block = config.block_tokens
        per_token = KVCache.bytes_per_token(
            kv_cache.num_layers, kv_cache.num_kv_heads, kv_cache.head_dim, kv_cache.dtype
        )  # V shares K's buffer under MLA, but the host tier copies both (twice the latent)
        num_blocks = config.host_blocks(kv_cache.size, per_token)
        check_host_tier_fits(
            num_blocks * self.block * per_token,
            kv_cache.size * per_token,
            kv_cache.device.type == "cpu",
        )
        self.host = HostKVPool(
            num_blocks,
            self.block,
            kv_cache.num_layers,
            kv_cache.num_kv_heads,
            kv_cache.head_dim,
            kv_cache.dtype,
        )
        self.seed = identity_seed(identity)
        self.storage: FileStorage | None = None
        if config.storage_dir is not None:
            self.storage = FileStorage(
                config.storage_dir, identity, self.host.block_shape, kv_cache.dtype
            )
        self.stats = HiCacheStats()
        logger.info(
            "Hierarchical cache: host tier %d blocks x %d tokens (%.1f MiB), write policy %s, "
            "storage %s",
            self.host.num_blocks,
            self.block,
            self.host.num_blocks * self.block * per_token / 2**20,
            config.write_policy,
            config.storage_dir or "none",
        )

    # -- device -> host (-> disk) -----------------------------------------------------------
    def backup(self, tokens: list[int], slots: torch.Tensor, start: int = 0) -> int:
        """Give every full block of tokens[:len(slots)] that ends after `start` a host copy
        (and a disk copy with a storage tier), reading KV from device `slots`. Returns how
        many blocks were copied; blocks already on the host are only marked recently used."""
        count = len(slots) // self.block
        keys = block_hashes(self.seed, tokens, self.block, count)
        first = start // self.block
        todo: list[tuple[int, str, int]] = []
        for i in range(first, len(keys)):
            if self.host.lookup(keys[i]) is not None:
                continue
            block = self.host.allocate(keys[i])
            if block is None:
                break
            self.host.pin(block)  # so filling the pool does not evict this batch's own blocks
            todo.append((i, keys[i], block))
        if not todo:
            return 0
        b = self.block
        src = torch.cat([slots[i * b : (i + 1) * b] for i, _, _ in todo])
        ids = torch.tensor([blk for _, _, blk in todo], dtype=torch.int64)
        shape = (len(todo), b, self.kv.num_kv_heads, self.kv.head_dim)
        host = self.host.data
        for layer in range(self.kv.num_layers):
            k, v = self.kv.get_kv(layer)
            host[ids, layer, 0] = k[src].view(shape).to(host.device)
            host[ids, layer, 1] = v[src].view(shape).to(host.device)
        for i, key, blk in todo:
            self.host.unpin(blk)
            if self.storage is not None and not self.storage.exists(key):
                self.storage.write(key, tokens[i * b : (i + 1) * b], host[blk])
        self.stats.backed_up_blocks += len(todo)
        return len(todo)

    # -- host / disk -> device --------------------------------------------------------------
    def find(self, tokens: list[int], device_len: int, limit: int) -> LoadPlan:
        """The blocks, found on the host or on disk, that continue the device match of
        `device_len` tokens within tokens[:limit]; disk blocks are read into the host pool.
        Every returned block is pinned until `load` or `release`."""
        first, last = device_len // self.block, limit // self.block
        if last <= first:
            return EMPTY_PLAN
        keys = block_hashes(self.seed, tokens, self.block, last)
        offset = device_len - first * self.block
        blocks: list[int] = []
        host_tokens = storage_tokens = 0
        for j in range(first, last):
            size = self.block - (offset if j == first else 0)
            block = self.host.lookup(keys[j])
            if block is not None:
                host_tokens += size
            else:
                block = self._read_storage(keys[j], tokens[j * self.block : (j + 1) * self.block])
                if block is None:
                    break
                storage_tokens += size
            self.host.pin(block)
            blocks.append(block)
        return LoadPlan(blocks, offset, host_tokens, storage_tokens)

    def load(self, plan: LoadPlan, dst: torch.Tensor) -> None:
        """Copy the plan's tokens into device slots `dst` and unpin its blocks."""
        assert len(dst) == plan.tokens, (len(dst), plan.tokens)
        ids = torch.tensor(plan.blocks, dtype=torch.int64)
        dims = (-1, self.kv.num_kv_heads, self.kv.head_dim)
        for layer in range(self.kv.num_layers):
            k, v = self.kv.get_kv(layer)
            k[dst] = self.host.data[ids, layer, 0].reshape(dims)[plan.offset :].to(k.device)
            v[dst] = self.host.data[ids, layer, 1].reshape(dims)[plan.offset :].to(v.device)
        self.release(plan)
        self.stats.host_hit_tokens += plan.host_tokens
        self.stats.storage_hit_tokens += plan.storage_tokens
        self.stats.loaded_blocks += len(plan.blocks)

    def release(self, plan: LoadPlan) -> None:
        for block in plan.blocks:
            self.host.unpin(block)

    def _read_storage(self, key: str, tokens: list[int]) -> int | None:
        if self.storage is None:
            return None
        data = self.storage.read(key, tokens)
        if data is None:
            return None
        block = self.host.allocate(key)
        if block is None:
            return None
        self.host.data[block].copy_(data)
        return block

    # -- housekeeping -----------------------------------------------------------------------
    def clear_host(self) -> None:
        """Drop the host tier (flush_cache); the disk tier is kept, as SGLang keeps storage."""
        self.host.clear()

    def reset_after_failure(self) -> None:
        """After a failed step: forget pins a half-done load may have left, and the host tier."""
        self.host.clear(force=True)

    def info(self) -> dict[str, int | str | None]:
        storage = self.storage
        return {
            "hicache_write_policy": self.config.write_policy,
            "hicache_block_tokens": self.block,
            "hicache_host_capacity_tokens": self.host.num_blocks * self.block,
            "hicache_host_used_tokens": self.host.used_blocks() * self.block,
            "hicache_storage_backend": "file" if storage is not None else None,
            "hicache_storage_dir": str(storage.root) if storage is not None else None,
            "hicache_storage_writes": storage.writes if storage is not None else 0,
            "hicache_storage_corrupt_files": storage.corrupt_files if storage is not None else 0,
            "hicache_backed_up_blocks": self.stats.backed_up_blocks,
            "hicache_loaded_blocks": self.stats.loaded_blocks,
        }
