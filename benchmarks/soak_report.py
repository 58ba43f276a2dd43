"""The soak's summary (one dict, also written as soak.json) and its markdown report."""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _intervals(soak: Any, load_started: float, interval: float) -> list[dict[str, Any]]:
    rows: dict[int, list[float]] = {}
    counts: Counter[int] = Counter()
    for finished, out in soak.outcomes:
        idx = max(0, int((finished - load_started) // interval))
        counts[idx] += 1
        if not out.aborted_by_client and not out.problems:
            rows.setdefault(idx, []).append(out.latency_s)
    samples = sorted(soak.resources, key=lambda s: s["time"])
    out_rows = []
    for idx in range(max(counts, default=-1) + 1):
        end = load_started + (idx + 1) * interval
        # The resources sampled closest to the end of this interval.
        sample = min(samples, key=lambda s: abs(s["time"] - end)) if samples else {}
        lat = rows.get(idx, [])
        out_rows.append(
            {
                "interval": idx,
                "from_s": idx * interval,
                "finished": counts[idx],
                "p50_s": _quantile(lat, 0.5),
                "p99_s": _quantile(lat, 0.99),
                "rss_mib": sample.get("rss_mib"),
                "fds": sample.get("fds"),
            }
        )
    return out_rows


def build_summary(
    *,
    args: dict[str, Any],
    started: float,
    load_started: float,
    capacity: dict[str, Any],
    rate: float,
    soak: Any,
    idle_before: dict[str, Any],
    idle_after: dict[str, Any],
    server_exit_code: int | None,
) -> dict[str, Any]:
    outcomes = [out for _, out in soak.outcomes]
    kinds = Counter(o.kind for o in outcomes)
    ended_zero = sum(1 for o in outcomes if not o.aborted_by_client and o.ends < o.expected_ends)
    ended_twice = sum(1 for o in outcomes if o.ends > o.expected_ends)
    problems = [f"{o.kind}: {p}" for o in outcomes for p in o.problems]
    lost = sum(o.lost_tokens for o in outcomes)
    duplicated = sum(o.duplicated_tokens for o in outcomes)
    equal = sum(1 for e in soak.equality if e.get("equal"))
    resources = sorted(soak.resources, key=lambda s: s["time"])
    first, last = (resources[0], resources[-1]) if resources else ({}, {})
    latencies = [o.latency_s for o in outcomes if not o.aborted_by_client and not o.problems]
    passed = (
        not problems
        and capacity["problems"] == 0
        and lost == 0
        and duplicated == 0
        and ended_zero == 0
        and ended_twice == 0
        and equal == len(soak.equality)
        and bool(idle_after.get("idle"))
        and server_exit_code in (None, 0)
    )
    return {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in args.items()},
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
        "load_seconds": args["duration"],
        "capacity": capacity,
        "rate_rps": rate,
        "requests": len(outcomes),
        "by_kind": dict(sorted(kinds.items())),
        "choices": sum(o.n for o in outcomes),
        "aborted_by_client": sum(1 for o in outcomes if o.aborted_by_client),
        "skipped_over_max_outstanding": soak.skipped,
        "ended_zero_times": ended_zero,
        "ended_more_than_once": ended_twice,
        "lost_tokens": lost,
        "duplicated_tokens": duplicated,
        "problems": len(problems),
        "first_problems": problems[:20],
        "equality_probes": len(soak.equality),
        "equality_equal": equal,
        "equality_mismatches": [e for e in soak.equality if not e.get("equal")][:10],
        "latency_p50_s": _quantile(latencies, 0.5),
        "latency_p99_s": _quantile(latencies, 0.99),
        "latency_mean_s": statistics.fmean(latencies) if latencies else None,
        "rss_start_mib": first.get("rss_mib"),
        "rss_end_mib": last.get("rss_mib"),
        "fds_start": first.get("fds"),
        "fds_end": last.get("fds"),
        "server_processes": last.get("processes"),
        "intervals": _intervals(soak, load_started, args["interval"]),
        "resources": resources,
        "idle_before": idle_before,
        "idle_after": idle_after,
        "server_exit_code": server_exit_code,
        "passed": passed,
        "verdict": "PASS" if passed else "FAIL",
    }


def _fmt(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def markdown(s: dict[str, Any]) -> str:
    a = s["args"]
    cap = s["capacity"]
    lines = [
        f"# Soak report: {s['verdict']}",
        "",
        f"Started {s['started']}; {s['load_seconds']:.0f} s of load at {a['load_fraction']:.0%} "
        f"of the measured capacity ({cap['rps']:.2f} requests/s with {cap['concurrency']} "
        f"clients in a closed loop over {cap['seconds']:.0f} s), i.e. {s['rate_rps']:.2f} "
        "requests/s of Poisson arrivals.",
        f"Server started by the script: `radixserve serve {a['server_args']}`."
        if a.get("started_server")
        else f"Server: {a['base_url']} (pid {a.get('server_pid')}).",
        "",
        "| check | result |",
        "|---|---|",
        f"| requests (choices) | {s['requests']} ({s['choices']}) |",
        f"| by kind | {', '.join(f'{k} {v}' for k, v in s['by_kind'].items())} |",
        f"| closed by the client on purpose | {s['aborted_by_client']} |",
        f"| skipped (over --max-outstanding) | {s['skipped_over_max_outstanding']} |",
        f"| choices that ended zero times | {s['ended_zero_times']} |",
        f"| requests with a choice that ended twice | {s['ended_more_than_once']} |",
        f"| lost tokens / duplicated tokens | {s['lost_tokens']} / {s['duplicated_tokens']} |",
        f"| other problems (capacity probe: {cap['problems']}) | {s['problems']} |",
        f"| stream vs non-stream equality (temperature 0) | {s['equality_equal']} of "
        f"{s['equality_probes']} equal |",
        f"| latency p50 / p99 (whole run) | {_fmt(s['latency_p50_s'])} s / "
        f"{_fmt(s['latency_p99_s'])} s |",
        f"| server RSS (all {s['server_processes']} processes) start -> end | "
        f"{_fmt(s['rss_start_mib'], '.0f')} -> {_fmt(s['rss_end_mib'], '.0f')} MiB |",
        f"| open fds start -> end | {s['fds_start']} -> {s['fds_end']} |",
        f"| idle afterwards (nothing running or waiting, KV free or cached) | "
        f"{s['idle_after'].get('idle')} |",
        f"| server exit code after SIGTERM | {s['server_exit_code']} |",
        "",
        "## Over time",
        "",
        "| from (s) | finished | p50 (s) | p99 (s) | RSS (MiB) | fds |",
        "|---|---|---|---|---|---|",
    ]
    for row in s["intervals"]:
        lines.append(
            f"| {row['from_s']:.0f} | {row['finished']} | {_fmt(row['p50_s'])} | "
            f"{_fmt(row['p99_s'])} | {_fmt(row['rss_mib'], '.0f')} | {row['fds']} |"
        )
    if s["first_problems"]:
        lines += ["", "## First problems", ""]
        lines += [f"- {p}" for p in s["first_problems"]]
    if s["equality_mismatches"]:
        lines += ["", "## Equality mismatches", ""]
        lines += [f"- `{json.dumps(m)[:300]}`" for m in s["equality_mismatches"]]
    return "\n".join(lines) + "\n"


def write_reports(summary: dict[str, Any], folder: Path) -> None:
    (folder / "soak.json").write_text(json.dumps(summary, indent=2, default=str))
    (folder / "soak.md").write_text(markdown(summary))
