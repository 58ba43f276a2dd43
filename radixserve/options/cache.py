"""Options: hierarchical (host/storage) and external KV caches."""

from __future__ import annotations

from radixserve.options.choices import HICACHE_STORAGE_BACKEND_CHOICES
from radixserve.options.spec import IMPLEMENTED, NOT_APPLICABLE, OptionSpec, flag, value
from radixserve.options.value_types import FLOAT, INT, STR

AREA = "Hierarchical and external KV cache"

OPTIONS: tuple[OptionSpec, ...] = (
    flag(
        "--enable-hierarchical-cache",
        "Hierarchical KV cache: radix-cache prefixes evicted from the device KV pool keep a "
        "copy in a larger host pool (and, with --hicache-storage-backend, on disk) and are "
        "loaded back on a prefix hit instead of being recomputed.",
        support=IMPLEMENTED,
    ),
    value(
        "--hicache-host-memory-mode",
        STR,
        "cache",
        "Host memory as a cache tier or as a staging buffer only.",
        choices=("cache", "buffer_only"),
    ),
    value(
        "--hicache-ratio",
        FLOAT,
        2.0,
        "Host KV pool size relative to the device pool.",
        support=IMPLEMENTED,
    ),
    value(
        "--hicache-size",
        INT,
        0,
        "Host KV pool size in GB (overrides --hicache-ratio).",
        support=IMPLEMENTED,
    ),
    value(
        "--hicache-write-policy",
        STR,
        "write_through",
        "When device KV gets its host copy: write_through (as soon as it enters the radix "
        "cache), write_through_selective (once a request reuses it), write_back (when it is "
        "evicted from the device).",
        choices=("write_back", "write_through", "write_through_selective"),
        support=IMPLEMENTED,
    ),
    value(
        "--hicache-io-backend",
        STR,
        "kernel",
        "IO backend between host and device KV pools (copies are PyTorch index copies here).",
        choices=("direct", "kernel", "kernel_ascend"),
        support=NOT_APPLICABLE,
    ),
    value(
        "--hicache-mem-layout",
        STR,
        "page_first",
        "Layout of the host KV pool (page_first: [block, layer, k/v, token, head, dim]).",
        support=IMPLEMENTED,
        supported_choices=("page_first",),
        choices=(
            "layer_first",
            "page_first",
            "page_first_direct",
            "page_first_kv_split",
            "page_head",
        ),
    ),
    value(
        "--hicache-storage-backend",
        STR,
        None,
        "Storage backend of the hierarchical cache: file (one file per KV block under "
        "$SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR, default /tmp/hicache).",
        choices=HICACHE_STORAGE_BACKEND_CHOICES,
        support=IMPLEMENTED,
        supported_choices=("file",),
    ),
    value(
        "--hicache-storage-prefetch-policy",
        STR,
        "timeout",
        "When prefetching from storage stops.",
        choices=("best_effort", "wait_complete", "timeout"),
    ),
    value(
        "--hicache-storage-backend-extra-config",
        STR,
        None,
        "Extra storage backend config (JSON, or @file).",
    ),
    value(
        "--hicache-storage-prefetch-retry-poll-interval",
        INT,
        0,
        "Scheduling passes before a storage prefetch miss is retried; 0 disables.",
    ),
    value(
        "--hicache-storage-prefetch-retry-max-attempts",
        INT,
        4,
        "Maximum storage prefetch retries per request.",
    ),
    flag(
        "--enable-unified-cache-external-linker",
        "Link the radix cache directly to an external KV store.",
    ),
    value(
        "--unified-cache-external-linker-backend",
        STR,
        "mooncake",
        "Storage backend of the external linker.",
        choices=("mooncake", "mori"),
    ),
    flag("--enable-hisparse", "Hierarchical sparse attention."),
    value(
        "--hisparse-config",
        STR,
        None,
        "JSON config of hierarchical sparse attention.",
        aliases=("--hierarchical-sparse-attention-extra-config",),
    ),
    flag("--enable-lmcache", "Use LMCache as the hierarchical cache."),
    value("--lmcache-config-file", STR, None, "LMCache YAML config file."),
    flag("--enable-flexkv", "Use FlexKV for host-tier KV offload."),
    value("--flexkv-config-file", STR, None, "FlexKV config file."),
)
