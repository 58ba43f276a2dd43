"""Options: memory, scheduling and the radix cache."""

from __future__ import annotations

from radixserve.options.spec import IMPLEMENTED, NOT_APPLICABLE, OptionSpec, flag, value
from radixserve.options.value_types import FLOAT, INT, JSON_OBJECT, STR, TOKENS

AREA = "Memory and scheduling"

OPTIONS: tuple[OptionSpec, ...] = (
    value(
        "--mem-fraction-static",
        FLOAT,
        None,
        "Fraction of device memory (RAM on CPU) for weights plus the KV cache pool. Resolved from the device size when unset; on CPU, when neither this nor --max-total-tokens is given, the pool is capped at 4 full contexts (at least 65,536 tokens), its pages committed as used.",
        support=IMPLEMENTED,
    ),
    value(
        "--max-running-requests",
        INT,
        None,
        "Maximum number of requests running at once.",
        support=IMPLEMENTED,
    ),
    value(
        "--max-queued-requests",
        INT,
        None,
        "Maximum number of waiting requests; more are rejected.",
        support=IMPLEMENTED,
    ),
    value(
        "--max-total-tokens",
        TOKENS,
        None,
        "Size of the KV cache pool in tokens (computed from memory when unset). Accepts suffixes like 128k.",
        support=IMPLEMENTED,
    ),
    value(
        "--chunked-prefill-size",
        INT,
        None,
        "Maximum tokens per prefill chunk; -1 disables chunked prefill. Resolved from the device when unset.",
        support=IMPLEMENTED,
    ),
    value(
        "--prefill-decode-interval",
        INT,
        0,
        "Decode rounds to run after a prefill batch before the next prefill; 0 disables.",
    ),
    flag("--enable-dynamic-chunking", "Adjust chunk sizes dynamically under pipeline parallelism."),
    value(
        "--max-prefill-tokens",
        TOKENS,
        16384,
        "Maximum tokens in one prefill batch. Accepts suffixes like 16k.",
        support=IMPLEMENTED,
    ),
    value("--prefill-max-requests", INT, None, "Maximum number of requests in one prefill batch."),
    value(
        "--schedule-policy",
        STR,
        "fcfs",
        "Order in which waiting requests are admitted.",
        support=IMPLEMENTED,
        choices=("lpm", "random", "fcfs", "dfs-weight", "lof", "priority", "routing-key", "hrrn"),
        supported_choices=("lpm", "random", "fcfs", "dfs-weight", "lof", "priority"),
    ),
    flag(
        "--enable-priority-scheduling",
        "Schedule requests by their priority value (higher first by default).",
        support=IMPLEMENTED,
    ),
    flag(
        "--disable-priority-preemption",
        "Do not preempt running requests for higher-priority ones.",
        support=IMPLEMENTED,
    ),
    value(
        "--default-priority-value",
        INT,
        None,
        "Priority given to requests that do not set one.",
        support=IMPLEMENTED,
    ),
    flag(
        "--abort-on-priority-when-disabled",
        "Abort requests that set a priority while priority scheduling is off (400).",
        support=IMPLEMENTED,
    ),
    flag(
        "--schedule-low-priority-values-first",
        "With priority scheduling, lower priority values run first.",
        support=IMPLEMENTED,
    ),
    value(
        "--priority-scheduling-preemption-threshold",
        INT,
        10,
        "A waiting request preempts running ones whose priority is worse by more than this.",
        support=IMPLEMENTED,
    ),
    value(
        "--retraction-policy",
        STR,
        "length",
        "Which decode requests to retract first when the KV cache is full.",
        support=IMPLEMENTED,
        choices=("length", "priority"),
    ),
    value(
        "--schedule-conservativeness",
        FLOAT,
        1.0,
        "How conservatively new requests are admitted; larger means fewer retractions.",
        support=IMPLEMENTED,
    ),
    value(
        "--page-size",
        INT,
        None,
        "Tokens per KV cache page (resolved to 1 when unset).",
        support=IMPLEMENTED,
    ),
    value(
        "--c128-page-size",
        INT,
        16,
        "Physical page size of the NPU DSV4 C128 KV cache.",
        support=NOT_APPLICABLE,
    ),
    value(
        "--swa-full-tokens-ratio",
        FLOAT,
        0.8,
        "Ratio of sliding-window layer KV tokens to full layer KV tokens.",
    ),
    flag("--disable-hybrid-swa-memory", "Disable the hybrid sliding-window memory pool."),
    value(
        "--radix-eviction-policy",
        STR,
        "lru",
        "Eviction policy of the radix prefix cache.",
        support=IMPLEMENTED,
        choices=("lru", "lfu", "slru", "priority"),
        supported_choices=("lru", "lfu", "slru", "priority"),
    ),
    value(
        "--radix-eviction-policy-config",
        JSON_OBJECT,
        None,
        "JSON tuning parameters for the radix eviction policy.",
    ),
    flag(
        "--prefill-only-disable-kv-cache",
        "Skip KV cache allocation for prefill-only embedding workloads.",
    ),
    flag("--disable-radix-cache", "Disable the radix prefix cache.", support=IMPLEMENTED),
    flag("--enable-page-major-kv-layout", "Lay out KV caches page-major instead of layer-major."),
    flag("--enable-unified-memory", "Share one memory buffer between hybrid-model pools."),
    flag(
        "--disable-chunked-prefix-cache",
        "Disable the chunked prefix cache (DeepSeek).",
        support=NOT_APPLICABLE,
    ),
    flag(
        "--disable-overlap-schedule",
        "Disable overlapping CPU scheduling with model execution. Here: radixserve always "
        "schedules between steps, never overlapped (the scheduler's Python work is ~2% of a "
        "decode step, measured, and an overlap thread would take a core from the kernels on a "
        "small CPU box), so the flag is accepted and what it asks for is what runs.",
        support=IMPLEMENTED,
    ),
    value(
        "--num-continuous-decode-steps",
        INT,
        1,
        "Decode steps to run back to back between scheduling passes.",
    ),
    value(
        "--scheduler-recv-interval", INT, 1, "Poll for new requests every N scheduler iterations."
    ),
    flag(
        "--enable-mixed-chunk",
        "Mix prefill chunks and decode tokens in one batch.",
        support=IMPLEMENTED,
    ),
    flag("--enable-prefill-delayer", "Delay prefills under DP attention to reduce idle time."),
    value(
        "--prefill-delayer-max-delay-passes",
        INT,
        30,
        "Maximum forward passes a prefill is delayed.",
    ),
    value(
        "--prefill-delayer-token-usage-low-watermark",
        FLOAT,
        None,
        "Token usage low watermark of the prefill delayer.",
    ),
    value(
        "--prefill-delayer-forward-passes-buckets",
        FLOAT,
        None,
        "Histogram buckets of delayed forward passes.",
        nargs="+",
    ),
    value(
        "--prefill-delayer-wait-seconds-buckets",
        FLOAT,
        None,
        "Histogram buckets of prefill delay seconds.",
        nargs="+",
    ),
    value(
        "--prefill-delayer-queue-min-ratio", FLOAT, None, "Queue-based prefill delay trigger ratio."
    ),
    value(
        "--prefill-delayer-max-delay-ms",
        FLOAT,
        None,
        "Maximum milliseconds of one queue-triggered delay.",
    ),
    value(
        "--min-free-slots-delay",
        INT,
        None,
        "Hold new prefills until this many running slots are free.",
    ),
)
