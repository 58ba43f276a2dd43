"""Cross-option rules of the hierarchical cache (--enable-hierarchical-cache, --hicache-*)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from radixserve.options.errors import ServerArgsError

# Options that only mean something with --enable-hierarchical-cache, and their defaults.
_NEEDS_HICACHE = {
    "hicache_ratio": ("--hicache-ratio", 2.0),
    "hicache_size": ("--hicache-size", 0),
    "hicache_write_policy": ("--hicache-write-policy", "write_through"),
    "hicache_storage_backend": ("--hicache-storage-backend", None),
}


def check_hicache(v: Mapping[str, Any]) -> None:
    if not v.get("enable_hierarchical_cache"):
        for dest, (name, default) in _NEEDS_HICACHE.items():
            if v.get(dest, default) != default:
                raise ServerArgsError(name, "only takes effect with --enable-hierarchical-cache")
        return
    if v.get("disable_radix_cache"):
        raise ServerArgsError(
            "--enable-hierarchical-cache",
            "needs the radix cache (it tiers the radix cache's prefixes); "
            "drop --disable-radix-cache",
        )
    if v.get("tp_size", 1) > 1:
        raise ServerArgsError(
            "--enable-hierarchical-cache", "is supported with --tp-size 1 only (for now)"
        )
    if v.get("enable_lora") or v.get("lora_paths"):
        # Host and disk blocks are keyed by base-model token hashes; adapters' KV would need
        # their namespace in the key.
        raise ServerArgsError(
            "--enable-hierarchical-cache", "is not supported with LoRA adapters (for now)"
        )
    ratio = v.get("hicache_ratio", 2.0)
    if ratio is None or ratio <= 0:
        raise ServerArgsError("--hicache-ratio", f"must be > 0, got {ratio}")
    size = v.get("hicache_size", 0)
    if size is None or size < 0:
        raise ServerArgsError(
            "--hicache-size", f"must be >= 0 (0: use --hicache-ratio), got {size}"
        )
