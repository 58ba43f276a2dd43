"""The mixed workload of benchmarks/pd_mix.py and the maths of its report (no servers here).

The workload is a fixed schedule: short chat-like requests at a steady rate, and long-prompt
requests every few seconds, each prompt random token ids (so no request hits another's prefix
in the radix cache). The same seed gives every configuration the same schedule and prompts.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from radixserve.benchmarking.metrics import RequestOutput, tpot

SHORT, LONG = "short", "long"
# Ids drawn from here are ordinary tokens in SmolLM2's vocabulary (49152): the low ids hold
# its special tokens.
TOKEN_ID_RANGE = (1000, 40000)


@dataclass(frozen=True)
class MixConfig:
    duration_s: float
    short_rate: float  # short requests per second
    short_input: int
    short_output: int
    long_interval_s: float  # one long request every this many seconds
    long_input: int
    long_output: int
    long_offset_s: float = 1.0  # the first long request arrives this late
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("duration_s", "short_rate", "long_interval_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("short_input", "short_output", "long_input", "long_output"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class Arrival:
    at_s: float  # seconds after the run starts
    kind: str  # SHORT or LONG
    prompt: tuple[int, ...]
    output_len: int


def schedule(config: MixConfig) -> list[Arrival]:
    """Every request of one run, ordered by arrival time. Short requests arrive evenly spaced
    (1 / short_rate apart, from time 0); long ones at long_offset_s, then every
    long_interval_s; all before duration_s."""
    rng = random.Random(config.seed)
    low, high = TOKEN_ID_RANGE

    def prompt(length: int) -> tuple[int, ...]:
        return tuple(rng.randint(low, high) for _ in range(length))

    arrivals: list[Arrival] = []
    count = int(np.ceil(config.duration_s * config.short_rate))
    for i in range(count):
        at = i / config.short_rate
        if at < config.duration_s:
            arrivals.append(Arrival(at, SHORT, prompt(config.short_input), config.short_output))
    at = config.long_offset_s
    while at < config.duration_s:
        arrivals.append(Arrival(at, LONG, prompt(config.long_input), config.long_output))
        at += config.long_interval_s
    arrivals.sort(key=lambda a: (a.at_s, a.kind))
    return arrivals


def _ms(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values) * 1000.0, q)) if values else None


@dataclass(frozen=True)
class KindSummary:
    kind: str
    sent: int
    completed: int
    ttft_median_ms: float | None
    ttft_p90_ms: float | None
    tpot_median_ms: float | None
    tpot_p90_ms: float | None


def summarize_kind(kind: str, outputs: Sequence[RequestOutput]) -> KindSummary:
    """TTFT and TPOT of the successful requests (TPOT as SGLang's bench_serving defines it:
    (latency - TTFT) / (output tokens - 1), only for requests with more than one token)."""
    done = [o for o in outputs if o.success]
    tpots = [t for o in done if (t := tpot(o)) is not None]
    ttfts = [o.ttft for o in done]
    return KindSummary(
        kind=kind,
        sent=len(outputs),
        completed=len(done),
        ttft_median_ms=_ms(ttfts, 50),
        ttft_p90_ms=_ms(ttfts, 90),
        tpot_median_ms=_ms(tpots, 50),
        tpot_p90_ms=_ms(tpots, 90),
    )


@dataclass(frozen=True)
class RunSummary:
    config: str
    repeat: int
    duration_s: float  # first send to last answer
    short: KindSummary
    long: KindSummary
    output_tokens_per_s: float
    requests_per_s: float
    load_before: float  # 1-minute load average
    load_after: float


def summarize_run(
    config: str,
    repeat: int,
    arrivals: Sequence[Arrival],
    outputs: Sequence[RequestOutput],
    duration_s: float,
    loads: tuple[float, float],
) -> RunSummary:
    if len(arrivals) != len(outputs):
        raise ValueError(f"{len(arrivals)} arrivals but {len(outputs)} outputs")
    by_kind = {
        kind: [o for a, o in zip(arrivals, outputs, strict=True) if a.kind == kind]
        for kind in (SHORT, LONG)
    }
    done = [o for o in outputs if o.success]
    dur = max(duration_s, 1e-9)
    return RunSummary(
        config=config,
        repeat=repeat,
        duration_s=duration_s,
        short=summarize_kind(SHORT, by_kind[SHORT]),
        long=summarize_kind(LONG, by_kind[LONG]),
        output_tokens_per_s=sum(o.output_len for o in done) / dur,
        requests_per_s=len(done) / dur,
        load_before=loads[0],
        load_after=loads[1],
    )


def _cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


TABLE_HEADER = (
    "| config | run | short TTFT med / p90 ms | short TPOT med / p90 ms | long TTFT med / p90 ms"
    " | long TPOT med / p90 ms | done short / long | out tok/s | req/s | load 1m before → after |"
)


def markdown_table(runs: Sequence[RunSummary]) -> str:
    """One Markdown row per run (docs/scaling.md carries this table)."""
    lines = [TABLE_HEADER, "|" + "---|" * TABLE_HEADER.count(" | ") + "---|"]
    for r in runs:
        s, g = r.short, r.long
        lines.append(
            f"| {r.config} | {r.repeat} "
            f"| {_cell(s.ttft_median_ms)} / {_cell(s.ttft_p90_ms)} "
            f"| {_cell(s.tpot_median_ms)} / {_cell(s.tpot_p90_ms)} "
            f"| {_cell(g.ttft_median_ms)} / {_cell(g.ttft_p90_ms)} "
            f"| {_cell(g.tpot_median_ms)} / {_cell(g.tpot_p90_ms)} "
            f"| {s.completed}/{s.sent} · {g.completed}/{g.sent} "
            f"| {r.output_tokens_per_s:.1f} | {r.requests_per_s:.2f} "
            f"| {r.load_before:.1f} → {r.load_after:.1f} |"
        )
    return "\n".join(lines)
