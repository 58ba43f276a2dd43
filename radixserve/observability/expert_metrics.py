"""MoE expert load for /metrics and the dashboard, from the scheduler's `expert_counts`
(--expert-distribution-recorder-mode stat: routings per layer and expert since the last
/start_expert_distribution_record).

Gauges, not counters: a new recording starts the counts from zero again. `expert` is the
logical expert (the router's id), whatever physical copies --ep-num-redundant-experts and
--enable-eplb placed it in: the counts are taken before a copy is chosen.
- sglang:moe_expert_load{layer, expert}: (token, slot) routings to the expert;
- sglang:moe_expert_balancedness{layer}: mean over max load (1.0: perfectly even), the ratio
  SGLang's EPLB reports as balancedness.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.core import GaugeMetricFamily


def moe_layers(info: Mapping[str, Any]) -> list[tuple[int, list[int]]]:
    """(layer index, per-expert counts) of the MoE layers that reported (dense rows dropped)."""
    rows: Sequence[Sequence[int]] = info.get("expert_counts") or []
    return [(layer, list(row)) for layer, row in enumerate(rows) if any(row)]


def balancedness(counts: Sequence[int]) -> float:
    top = max(counts, default=0)
    return sum(counts) / len(counts) / top if top else 1.0


def expert_families(info: Mapping[str, Any], model_name: str) -> Iterator[GaugeMetricFamily]:
    layers = moe_layers(info)
    if not layers:
        return
    load = GaugeMetricFamily(
        "sglang:moe_expert_load",
        "Token routings to each expert of each MoE layer since recording started.",
        labels=["model_name", "layer", "expert"],
    )
    balance = GaugeMetricFamily(
        "sglang:moe_expert_balancedness",
        "Mean over max expert load of each MoE layer (1.0: even).",
        labels=["model_name", "layer"],
    )
    for layer, counts in layers:
        for expert, count in enumerate(counts):
            load.add_metric([model_name, str(layer), str(expert)], float(count))
        balance.add_metric([model_name, str(layer)], balancedness(counts))
    yield load
    yield balance


def dashboard_rows(info: Mapping[str, Any]) -> dict[str, Any] | None:
    """The dashboard's expert panel: each MoE layer's counts and balancedness; None when the
    recorder is off."""
    if "expert_counts" not in info:
        return None
    return {
        "recording": bool(info.get("expert_recording")),
        "layers": [
            {"layer": layer, "counts": counts, "balancedness": balancedness(counts)}
            for layer, counts in moe_layers(info)
        ],
    }
