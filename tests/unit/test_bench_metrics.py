"""Serving metrics from known timestamps: TTFT, ITL, TPOT, percentiles, cache hit rate."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from radixserve.benchmarking.metrics import (
    RequestOutput,
    StreamTimer,
    cache_hit_rate,
    calculate_metrics,
    itl_from_timestamps,
    tpot,
)


def test_ttft_and_itl_from_chunk_times() -> None:
    ttft, itl = itl_from_timestamps(10.0, [10.5, 10.7, 11.0, 11.4])
    assert ttft == pytest.approx(0.5)
    assert itl == pytest.approx([0.2, 0.3, 0.4])


def test_a_chunk_of_several_tokens_splits_its_gap() -> None:
    # Chunks carrying 1, 2 and 1 tokens: the 2-token chunk counts as two gaps of half its time.
    ttft, itl = itl_from_timestamps(0.0, [0.1, 0.5, 0.6], [1, 2, 1])
    assert ttft == pytest.approx(0.1)
    assert itl == pytest.approx([0.2, 0.2, 0.1])


def test_stream_timer_ignores_chunks_without_new_tokens() -> None:
    timer = StreamTimer(0.0)
    timer.chunk(0.2, total_tokens=1)
    timer.chunk(0.3, total_tokens=1)  # e.g. a final chunk with only the finish reason
    timer.chunk(0.6, total_tokens=2)
    assert timer.ttft == pytest.approx(0.2)
    assert timer.itl == pytest.approx([0.4])


def _output(latency: float, ttft: float, n_out: int, n_in: int = 10, **kw: Any) -> RequestOutput:
    return RequestOutput(
        success=True, latency=latency, ttft=ttft, prompt_len=n_in, output_len=n_out, **kw
    )


def test_tpot_excludes_the_first_token() -> None:
    assert tpot(_output(1.0, 0.2, 5)) == pytest.approx(0.2)
    assert tpot(_output(1.0, 0.2, 1)) is None


def test_calculate_metrics_fields_and_values() -> None:
    outputs = [
        _output(1.0, 0.1, 10, itl=[0.1] * 9),
        _output(2.0, 0.3, 5, n_in=20, itl=[0.4, 0.4, 0.4, 0.5]),
        RequestOutput(success=False, error="boom", prompt_len=99),
    ]
    m = calculate_metrics(outputs, duration_s=4.0)
    assert m["completed"] == 2 and m["failed"] == 1
    assert m["total_input_tokens"] == 30 and m["total_output_tokens"] == 15
    assert m["request_throughput"] == pytest.approx(0.5)
    assert m["input_throughput"] == pytest.approx(7.5)
    assert m["output_throughput"] == pytest.approx(3.75)
    assert m["total_throughput"] == pytest.approx(11.25)
    assert m["mean_ttft_ms"] == pytest.approx(200.0)
    assert m["median_ttft_ms"] == pytest.approx(200.0)
    assert m["p99_ttft_ms"] == pytest.approx(np.percentile([100.0, 300.0], 99))
    tpots = [0.9 / 9 * 1000, 1.7 / 4 * 1000]
    assert m["mean_tpot_ms"] == pytest.approx(np.mean(tpots))
    itls = np.array([0.1] * 9 + [0.4, 0.4, 0.4, 0.5]) * 1000
    assert m["mean_itl_ms"] == pytest.approx(itls.mean())
    assert m["median_itl_ms"] == pytest.approx(np.median(itls))
    assert m["p95_itl_ms"] == pytest.approx(np.percentile(itls, 95))
    assert m["max_itl_ms"] == pytest.approx(500.0)
    assert m["mean_e2e_latency_ms"] == pytest.approx(1500.0)
    assert m["p99_e2e_latency_ms"] == pytest.approx(np.percentile([1000.0, 2000.0], 99))
    assert m["concurrency"] == pytest.approx(0.75)
    assert m["cache_hit_rate"] is None


def test_no_successful_request_gives_zeros_not_errors() -> None:
    m = calculate_metrics([RequestOutput(error="refused")], duration_s=1.0)
    assert m["completed"] == 0 and m["mean_ttft_ms"] == 0.0 and m["max_itl_ms"] == 0.0


def test_cache_hit_rate_over_requests_that_report_it() -> None:
    outputs = [
        _output(1.0, 0.1, 2, cached_tokens=30, server_prompt_tokens=40),
        _output(1.0, 0.1, 2, cached_tokens=0, server_prompt_tokens=60),
        _output(1.0, 0.1, 2),  # no report: left out
    ]
    assert cache_hit_rate(outputs) == pytest.approx(0.3)
    assert calculate_metrics(outputs, 1.0)["cache_hit_rate"] == pytest.approx(0.3)
