"""Per-request timings and the serving metrics SGLang's bench_serving reports, by its names.

TTFT is the time to the first streamed chunk with output; ITL the gaps between later chunks
(a chunk carrying k tokens counts as k gaps of 1/k of it, as SGLang does for /generate); TPOT
is (latency - TTFT) / (output tokens - 1) per request; concurrency is the sum of request
latencies over the benchmark duration.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class RequestOutput:
    """What one request measured (seconds, relative to its own start)."""

    success: bool = False
    generated_text: str = ""
    latency: float = 0.0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_len: int = 0
    output_len: int = 0
    start_time: float = 0.0  # perf_counter at send
    error: str = ""
    cached_tokens: int | None = None  # prompt tokens the server served from its prefix cache
    server_prompt_tokens: int | None = None  # the prompt length the server reported


class StreamTimer:
    """Builds TTFT and ITL from the arrival times of streamed chunks."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.ttft: float | None = None
        self.itl: list[float] = []
        self.last = start
        self.tokens = 0

    def chunk(self, now: float, total_tokens: int | None = None) -> None:
        """A chunk with output arrived at `now`; `total_tokens` is the cumulative output count
        when the server reports it (else the chunk counts as one token)."""
        new = 1 if total_tokens is None else total_tokens - self.tokens
        if new <= 0:
            return
        if self.ttft is None:
            self.ttft = now - self.start
        else:
            gap = (now - self.last) / new
            self.itl.extend([gap] * new)
        self.tokens += new
        self.last = now


def itl_from_timestamps(
    start: float, chunk_times: Sequence[float], tokens_per_chunk: Sequence[int] | None = None
) -> tuple[float, list[float]]:
    """(TTFT, ITLs) for chunks that arrived at `chunk_times` after a request sent at `start`."""
    timer = StreamTimer(start)
    counts = tokens_per_chunk or [1] * len(chunk_times)
    total = 0
    for now, count in zip(chunk_times, counts, strict=True):
        total += count
        timer.chunk(now, total)
    return (timer.ttft if timer.ttft is not None else 0.0), timer.itl


def tpot(output: RequestOutput) -> float | None:
    if output.output_len <= 1:
        return None
    return (output.latency - output.ttft) / (output.output_len - 1)


def _stats(name: str, values_s: Sequence[float], extra: Sequence[int] = ()) -> dict[str, float]:
    """mean/median/std/p99 (plus p<extra>) of `values_s` in ms, as SGLang's keys name them."""
    arr = np.asarray(values_s if len(values_s) else [0.0], dtype=np.float64) * 1000.0
    out = {
        f"mean_{name}_ms": float(np.mean(arr)),
        f"median_{name}_ms": float(np.median(arr)),
        f"std_{name}_ms": float(np.std(arr)),
        f"p99_{name}_ms": float(np.percentile(arr, 99)),
    }
    for p in extra:
        out[f"p{p}_{name}_ms"] = float(np.percentile(arr, p))
    return out


def cache_hit_rate(outputs: Sequence[RequestOutput]) -> float | None:
    """Cached prompt tokens over prompt tokens, over the requests whose responses said both."""
    reported = [
        o for o in outputs if o.success and o.cached_tokens is not None and o.server_prompt_tokens
    ]
    prompt = sum(o.server_prompt_tokens or 0 for o in reported)
    if not prompt:
        return None
    return sum(o.cached_tokens or 0 for o in reported) / prompt


def calculate_metrics(outputs: Sequence[RequestOutput], duration_s: float) -> dict[str, Any]:
    """SGLang's result fields for a finished run (`duration_s`: first send to last answer)."""
    done = [o for o in outputs if o.success]
    total_input = sum(o.prompt_len for o in done)
    total_output = sum(o.output_len for o in done)
    latencies = [o.latency for o in done]
    dur = max(duration_s, 1e-9)
    result: dict[str, Any] = {
        "duration": duration_s,
        "completed": len(done),
        "failed": len(outputs) - len(done),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(done) / dur,
        "input_throughput": total_input / dur,
        "output_throughput": total_output / dur,
        "total_throughput": (total_input + total_output) / dur,
    }
    result.update(_stats("e2e_latency", latencies))
    result.update(_stats("ttft", [o.ttft for o in done]))
    result.update(_stats("tpot", [t for o in done if (t := tpot(o)) is not None]))
    itls = [gap for o in done for gap in o.itl]
    result.update(_stats("itl", itls, extra=(95,)))
    result["max_itl_ms"] = float(max(itls, default=0.0) * 1000.0)
    result["concurrency"] = sum(latencies) / dur
    result["cache_hit_rate"] = cache_hit_rate(outputs)
    return result
