"""Prometheus metrics with SGLang's `sglang:` names and its `model_name` label.

Counters and latency histograms are fed by the HTTP layer as requests progress; the gauges
(running and queued requests, KV usage, cache hit rate) come from the engine snapshot handed to
`render` at scrape time, so they are never stale. Each server owns its own registry, so several
apps in one process (tests) do not collide.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from radixserve.observability.expert_metrics import expert_families

logger = logging.getLogger(__name__)


class FinishedMeta(Protocol):
    """What the metrics read of a result's meta info (managers/outputs.py's MetaInfo; a
    protocol keeps this package a leaf)."""

    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def cached_tokens(self) -> int: ...
    @property
    def finished(self) -> bool: ...
    @property
    def aborted(self) -> bool: ...


class StreamChunk(Protocol):
    """What the metrics read of a stream chunk (managers/outputs.py's GenerateOutput)."""

    @property
    def output_ids(self) -> Sequence[int] | None: ...
    @property
    def meta_info(self) -> FinishedMeta: ...


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# SGLang's default buckets.
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0)
ITL_BUCKETS = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.010,
    0.015,
    0.020,
    0.025,
    0.030,
    0.035,
    0.040,
    0.060,
    0.080,
    0.100,
    0.200,
    0.400,
    0.600,
    0.800,
    1.000,
    2.000,
    4.000,
    6.000,
)
E2E_BUCKETS = (
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1.0,
    2.0,
    4.0,
    6.0,
    8.0,
    10.0,
    20.0,
    40.0,
    60.0,
    80.0,
    100.0,
    200.0,
    400.0,
    800.0,
)


class _EngineGauges(Collector):
    """Gauges computed from the engine snapshot of the current scrape."""

    def __init__(self, metrics: ServingMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        snapshot = self.metrics.snapshot
        states = snapshot.get("internal_states") or []
        if len(states) > 1:
            # --dp-size: one series per replica, labelled dp_rank as SGLang's schedulers do.
            yield from self._per_replica(states)
        else:
            yield from self._gauges(engine_gauges(snapshot, self.metrics.cache_hit_rate()))
        yield from self._tiers(snapshot)
        yield from expert_families(snapshot, self.metrics.model_name)

    def _gauges(self, gauges: Mapping[str, float]) -> Iterator[GaugeMetricFamily]:
        for name, value in gauges.items():
            family = GaugeMetricFamily(f"sglang:{name}", GAUGE_DOCS[name], labels=["model_name"])
            family.add_metric([self.metrics.model_name], value)
            yield family

    def _tiers(self, snapshot: Mapping[str, Any]) -> Iterator[CounterMetricFamily]:
        tiers = tier_hits(snapshot)
        if tiers:
            family = CounterMetricFamily(
                "sglang:hicache_cached_tokens",
                "Prompt tokens served from the prefix cache, by hierarchical-cache tier.",
                labels=["model_name", "tier"],
            )
            for tier, value in tiers.items():
                family.add_metric([self.metrics.model_name, tier], value)
            yield family

    def _per_replica(self, states: list[Mapping[str, Any]]) -> Iterator[GaugeMetricFamily]:
        per_state = [engine_gauges(state, 0.0) for state in states]
        for name in GAUGE_DOCS:
            if not all(name in gauges for gauges in per_state):
                continue  # a gauge only some configurations have (speculative decoding's)
            family = GaugeMetricFamily(
                f"sglang:{name}", GAUGE_DOCS[name], labels=["model_name", "dp_rank"]
            )
            for rank, (state, gauges) in enumerate(zip(states, per_state, strict=True)):
                dp_rank = str(state.get("dp_rank", rank))
                family.add_metric([self.metrics.model_name, dp_rank], gauges[name])
            yield family


def tier_hits(info: Mapping[str, Any]) -> dict[str, float]:
    """Cached prompt tokens per tier (device / host / storage) with --enable-hierarchical-cache,
    else empty."""
    tiers = ("device", "host", "storage")
    if f"cached_tokens_{tiers[0]}_total" not in info:
        return {}
    return {tier: float(info.get(f"cached_tokens_{tier}_total") or 0) for tier in tiers}


GAUGE_DOCS = {
    "num_running_reqs": "The number of running requests",
    "num_queue_reqs": "The number of requests in the waiting queue",
    "num_used_tokens": "The number of used tokens",
    "max_total_num_tokens": "Maximum total number of tokens",
    "token_usage": "The token usage",
    "cache_hit_rate": "The cache hit rate",
    "spec_accept_length": "The average acceptance length of speculative decoding",
    "spec_accept_rate": "The acceptance rate of speculative decoding draft tokens",
    "num_prefill_inflight_queue_reqs": "PD prefill: rooms holding KV for their decode",
    "num_prefill_bootstrap_queue_reqs": "PD prefill: decode claims waiting for their room",
    "num_decode_prealloc_queue_reqs": "PD decode: requests waiting for KV slots",
    "num_decode_transfer_queue_reqs": "PD decode: requests whose KV is being transferred",
    "kv_transfer_total": "PD: KV transfers completed",
    "kv_transfer_failed_total": "PD: KV transfers or claims that failed",
    "kv_transfer_bytes_total": "PD prefill: KV bytes sent",
    "kv_transfer_latency_seconds_total": "PD: seconds spent in completed KV transfers",
}
# Reported only when the engine runs speculative decoding / prefill-decode disaggregation.
_SPEC_GAUGES = ("spec_accept_length", "spec_accept_rate")
_PD_GAUGES = (
    "num_prefill_inflight_queue_reqs",
    "num_prefill_bootstrap_queue_reqs",
    "num_decode_prealloc_queue_reqs",
    "num_decode_transfer_queue_reqs",
    "kv_transfer_total",
    "kv_transfer_failed_total",
    "kv_transfer_bytes_total",
    "kv_transfer_latency_seconds_total",
)


def engine_gauges(info: Mapping[str, Any], http_hit_rate: float) -> dict[str, float]:
    """The gauge values from one engine snapshot; /metrics and the dashboard both read these,
    so the two never disagree. `http_hit_rate` stands in when the engine reports no rate."""
    total = float(info.get("max_total_num_tokens") or 0)
    available = float(info.get("available_kv_tokens") or 0)
    cached = float(info.get("cached_tokens") or 0)
    # Tokens held by requests: what is neither free nor kept only by the prefix cache.
    used = max(total - available - cached, 0.0) if total else 0.0
    usage = info.get("token_usage")
    hit_rate = info.get("cache_hit_rate")
    values = {
        "num_running_reqs": info.get("num_running_reqs"),
        "num_queue_reqs": info.get("num_waiting_reqs"),
        "num_used_tokens": used,
        "max_total_num_tokens": total,
        "token_usage": usage if usage is not None else (used / total if total else 0),
        # The scheduler's own rate counts every prompt; ours only what went through HTTP.
        "cache_hit_rate": hit_rate if hit_rate is not None else http_hit_rate,
    }
    values.update({name: info[name] for name in (*_SPEC_GAUGES, *_PD_GAUGES) if name in info})
    return {name: float(value or 0) for name, value in values.items()}


class ServingMetrics:
    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.snapshot: Mapping[str, Any] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model_name"]

        def counter(name: str, doc: str) -> Any:
            c = Counter(f"sglang:{name}", doc, labels, registry=self.registry)
            return c.labels(model_name)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            h = Histogram(f"sglang:{name}", doc, labels, buckets=buckets, registry=self.registry)
            return h.labels(model_name)

        self.prompt_tokens = counter("prompt_tokens_total", "Number of prefill tokens processed.")
        self.generation_tokens = counter(
            "generation_tokens_total", "Number of generation tokens processed."
        )
        self.cached_tokens = counter("cached_tokens_total", "Number of cached prompt tokens.")
        self.num_requests = counter("num_requests_total", "Number of requests processed.")
        self.num_aborted = counter("num_aborted_requests_total", "Number of requests aborted.")
        self.ttft = histogram(
            "time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = histogram(
            "inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.e2e = histogram(
            "e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            E2E_BUCKETS,
        )
        self._prompt_sum = 0
        self._cached_sum = 0
        self.registry.register(_EngineGauges(self))

    def cache_hit_rate(self) -> float:
        return self._cached_sum / self._prompt_sum if self._prompt_sum else 0.0

    def totals(self) -> dict[str, float]:
        """Cumulative counters read back from the registry (the dashboard turns deltas between
        polls into rates, so no second collector keeps its own history)."""
        labels = {"model_name": self.model_name}
        names = {
            "prompt_tokens_total": "sglang:prompt_tokens_total",
            "generation_tokens_total": "sglang:generation_tokens_total",
            "cached_tokens_total": "sglang:cached_tokens_total",
            "num_requests_total": "sglang:num_requests_total",
            "ttft_seconds_sum": "sglang:time_to_first_token_seconds_sum",
            "ttft_count": "sglang:time_to_first_token_seconds_count",
        }
        return {
            key: float(self.registry.get_sample_value(sample, labels) or 0.0)
            for key, sample in names.items()
        }

    def observe_finished(self, meta: FinishedMeta, e2e_s: float) -> None:
        """Count one finished generation from its final meta info."""
        prompt = meta.prompt_tokens
        cached = meta.cached_tokens
        self.prompt_tokens.inc(prompt)
        self.generation_tokens.inc(meta.completion_tokens)
        self.cached_tokens.inc(cached)
        self._prompt_sum += prompt
        self._cached_sum += cached
        self.num_requests.inc()
        if meta.aborted:
            self.num_aborted.inc()
        self.e2e.observe(e2e_s)

    def stream_tracker(self) -> StreamTracker:
        return StreamTracker(self)

    def render(self, engine_snapshot: Mapping[str, Any] | None = None) -> bytes:
        """The exposition text; gauges use `engine_snapshot` (`Engine.get_server_info()`)."""
        self.snapshot = dict(engine_snapshot or {})
        return generate_latest(self.registry)


class StreamTracker:
    """Times one streamed generation: TTFT at its first tokens, then inter-token latency."""

    def __init__(self, metrics: ServingMetrics) -> None:
        self.metrics = metrics
        self.start = time.monotonic()
        self.last: float | None = None
        self.done = False

    def on_chunk(self, chunk: StreamChunk) -> None:
        now = time.monotonic()
        new_tokens = len(chunk.output_ids or ())
        if new_tokens:
            if self.last is None:
                self.metrics.ttft.observe(now - self.start)
            else:
                gap = (now - self.last) / new_tokens
                for _ in range(new_tokens):
                    self.metrics.itl.observe(gap)
            self.last = now
        meta = chunk.meta_info
        if meta.finished and not self.done:
            self.done = True
            self.metrics.observe_finished(meta, now - self.start)
