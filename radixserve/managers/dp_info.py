"""One /get_server_info answer from every data-parallel replica's own.

The top level reads like one big engine (counts and capacities summed, rates recomputed from
the summed totals), so /metrics' plain gauges, the dashboard and the HTTP layer's capacity need
no change; `internal_states` keeps each replica's own state (SGLang's list, one entry per
dp rank), with the controller's counters for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

SUMMED = (
    "num_running_reqs",
    "num_waiting_reqs",
    "max_total_num_tokens",
    "max_running_requests",
    "available_kv_tokens",
    "cached_tokens",
    "prompt_tokens_total",
    "cached_prompt_tokens_total",
    "prefill_tokens_total",
    "generation_tokens_total",
    "num_retractions_total",
    "cached_tokens_device_total",  # --enable-hierarchical-cache, per tier
    "cached_tokens_host_total",
    "cached_tokens_storage_total",
    # The controller's (radixserve's own, per replica in internal_states).
    "num_routed_reqs",
    "num_prefix_routed_reqs",
    "num_inflight_reqs",
    "num_inflight_tokens",
)


def merge_replica_infos(infos: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """`infos[d]` is replica d's scheduler info, with the controller's counters added."""
    merged: dict[str, Any] = {}
    for info in infos:  # keys only one replica has (or that are not counts): the first's
        for key, value in info.items():
            merged.setdefault(key, value)
    for key in SUMMED:
        values = [info[key] for info in infos if info.get(key) is not None]
        if values:
            merged[key] = sum(values)
    total = merged.get("max_total_num_tokens") or 0
    if total:
        # Each replica's usage weighted by its pool: the usage of the pools taken together.
        merged["token_usage"] = (
            sum(
                float(info.get("token_usage") or 0) * float(info.get("max_total_num_tokens") or 0)
                for info in infos
            )
            / total
        )
    prompt = merged.get("prompt_tokens_total") or 0
    if "cache_hit_rate" in merged:
        merged["cache_hit_rate"] = (
            (merged.get("cached_prompt_tokens_total") or 0) / prompt if prompt else 0.0
        )
    merged.pop("dp_rank", None)
    merged["dp_size"] = len(infos)
    merged["internal_states"] = [dict(info) for info in infos]
    return merged
