"""The hierarchical cache's settings, resolved once from the server arguments."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

# SGLang's file backend reads its folder from this variable, with the same default.
FILE_STORAGE_DIR_ENV = "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"
DEFAULT_FILE_STORAGE_DIR = "/tmp/hicache"

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
# Host and disk tiers move whole blocks of this many tokens (rounded up to a multiple of the
# page size): per-token hashing and per-token files would cost more than they save.
MIN_BLOCK_TOKENS = 32


@dataclass(frozen=True)
class HiCacheConfig:
    """What the host and storage tiers need; built by `from_server_args`."""

    write_policy: str
    host_ratio: float
    host_size_gb: float
    block_tokens: int
    storage_dir: str | None  # None: no disk tier

    @staticmethod
    def from_server_args(args: Any) -> HiCacheConfig | None:
        """None unless --enable-hierarchical-cache is set."""
        if not args.enable_hierarchical_cache:
            return None
        storage_dir = None
        if args.hicache_storage_backend == "file":
            storage_dir = os.environ.get(FILE_STORAGE_DIR_ENV) or DEFAULT_FILE_STORAGE_DIR
        return HiCacheConfig(
            write_policy=args.hicache_write_policy,
            host_ratio=float(args.hicache_ratio),
            host_size_gb=float(args.hicache_size or 0),
            block_tokens=block_tokens_for(args.page_size),
            storage_dir=storage_dir,
        )

    def host_blocks(self, device_tokens: int, bytes_per_token: int) -> int:
        """Host pool size in blocks: --hicache-size GB when set, else ratio x device pool."""
        if self.host_size_gb > 0:
            tokens = int(self.host_size_gb * 1e9) // bytes_per_token
        else:
            tokens = int(self.host_ratio * device_tokens)
        return max(tokens // self.block_tokens, 1)


def block_tokens_for(page_size: int) -> int:
    return -(-MIN_BLOCK_TOKENS // page_size) * page_size
