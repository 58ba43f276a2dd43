"""Builds the hierarchical cache for a scheduler from the server arguments."""

from __future__ import annotations

from typing import Any

import torch

from radixserve.mem_cache.hicache.config import HiCacheConfig
from radixserve.mem_cache.hicache.controller import HiCacheController
from radixserve.mem_cache.kv_cache import KVCache


def model_identity(args: Any, kv_cache: KVCache) -> str:
    """What must agree for stored KV to be reusable: the weights and the KV layout. Dummy
    weights depend on the seed, so it is part of their identity."""
    parts = [
        f"model={args.model_path}",
        f"revision={getattr(args, 'revision', None)}",
        f"load_format={args.load_format}",
        f"quantization={args.quantization}",
        f"layers={kv_cache.num_layers}",
        f"kv_heads={kv_cache.num_kv_heads}",
        f"head_dim={kv_cache.head_dim}",
        f"dtype={kv_cache.dtype}",
    ]
    if kv_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        # 8-bit codes mean K / k_scale: other scales make other codes.
        parts.append(f"kv_scales={kv_cache.k_scales},{kv_cache.v_scales}")
    if args.load_format == "dummy":
        parts.append(f"seed={args.random_seed}")
    return ";".join(parts)


def make_hicache(args: Any, kv_cache: KVCache) -> HiCacheController | None:
    config = HiCacheConfig.from_server_args(args)
    if config is None:
        return None
    return HiCacheController(config, kv_cache, model_identity(args, kv_cache))
