"""Options: logging, Prometheus metrics and tracing."""

from __future__ import annotations

from radixserve.options.spec import IMPLEMENTED, OptionSpec, flag, value
from radixserve.options.value_types import FLOAT, INT, JSON_OBJECT, STR

AREA = "Logging and metrics"

OPTIONS: tuple[OptionSpec, ...] = (
    value(
        "--log-level",
        STR,
        "info",
        "Log level of all loggers (debug, info, warning, error, critical).",
        support=IMPLEMENTED,
    ),
    value(
        "--log-level-http",
        STR,
        None,
        "Log level of the HTTP server (defaults to --log-level).",
        support=IMPLEMENTED,
    ),
    flag(
        "--log-requests",
        "Log requests and their outputs (detail set by --log-requests-level).",
        support=IMPLEMENTED,
    ),
    value(
        "--log-requests-level",
        INT,
        2,
        "0: metadata; 1: plus sampling params; 2: plus partial input/output; 3: everything.",
        support=IMPLEMENTED,
        choices=(0, 1, 2, 3),
    ),
    value(
        "--log-requests-format",
        STR,
        "text",
        "Request log format: text or json.",
        choices=("text", "json"),
    ),
    value(
        "--log-requests-target", STR, None, "Request log targets: stdout and/or folders.", nargs="+"
    ),
    value(
        "--uvicorn-access-log-exclude-prefixes",
        STR,
        (),
        "Request path prefixes left out of the HTTP access log.",
        support=IMPLEMENTED,
        nargs="*",
    ),
    value(
        "--crash-dump-folder",
        STR,
        None,
        "Folder for a JSON dump of the last 5 minutes of requests when a scheduler step crashes.",
        support=IMPLEMENTED,
    ),
    flag("--show-time-cost", "Log the time cost of marked code sections."),
    flag("--enable-metrics", "Expose Prometheus metrics on /metrics.", support=IMPLEMENTED),
    value(
        "--smg-http-sidecar-port",
        INT,
        None,
        "Port of the HTTP sidecar in SMG gRPC mode.",
        aliases=("--grpc-http-sidecar-port",),
    ),
    flag("--enable-mfu-metrics", "Export estimated MFU metrics."),
    flag("--enable-metrics-for-all-schedulers", "Record metrics on every scheduler rank."),
    value(
        "--load-snapshot-publish-interval",
        INT,
        15,
        "Publish a load snapshot every N decode iterations.",
    ),
    value(
        "--tokenizer-metrics-custom-labels-header",
        STR,
        "x-custom-labels",
        "HTTP header carrying custom metric labels.",
    ),
    value(
        "--tokenizer-metrics-allowed-custom-labels",
        STR,
        None,
        "Custom metric labels that requests may set.",
        nargs="+",
    ),
    value(
        "--extra-metric-labels", JSON_OBJECT, None, "JSON object of extra labels for all metrics."
    ),
    value(
        "--bucket-time-to-first-token",
        FLOAT,
        None,
        "Histogram buckets for time to first token.",
        nargs="+",
    ),
    value(
        "--bucket-inter-token-latency",
        FLOAT,
        None,
        "Histogram buckets for inter-token latency.",
        nargs="+",
    ),
    value(
        "--bucket-e2e-request-latency",
        FLOAT,
        None,
        "Histogram buckets for end-to-end latency.",
        nargs="+",
    ),
    value(
        "--prompt-tokens-buckets",
        STR,
        None,
        "Bucket rule for the prompt tokens histogram.",
        nargs="+",
    ),
    value(
        "--generation-tokens-buckets",
        STR,
        None,
        "Bucket rule for the generation tokens histogram.",
        nargs="+",
    ),
    value(
        "--gc-warning-threshold-secs",
        FLOAT,
        0.0,
        "Warn when a garbage collection takes longer than this; 0 disables.",
    ),
    value(
        "--decode-log-interval",
        INT,
        40,
        "Log decode statistics every N decode steps.",
        support=IMPLEMENTED,
    ),
    flag(
        "--enable-request-time-stats-logging",
        "Log each finished request's queue, running and end-to-end time.",
        support=IMPLEMENTED,
    ),
    value("--kv-events-config", STR, None, "JSON config for KV event publishing."),
    value(
        "--load-publish-endpoint",
        STR,
        None,
        "Endpoint of the runtime-load publisher for load-aware routers.",
    ),
    flag("--enable-forward-pass-metrics", "Publish per-iteration forward pass metrics over IPC."),
    flag("--enable-trace", "Enable OpenTelemetry tracing."),
    value("--trace-modules", STR, "request", "Components to trace."),
    value(
        "--otlp-traces-endpoint",
        STR,
        "localhost:4317",
        "OpenTelemetry collector endpoint (host:port).",
    ),
    flag("--export-metrics-to-file", "Write per-request metrics to files."),
    value("--export-metrics-to-file-dir", STR, None, "Folder for per-request metric files."),
)
