"""Mixture-of-experts rules: --enable-return-routed-experts and what it runs with, and what
expert placement (--ep-num-redundant-experts, --init-expert-location, --enable-eplb) needs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from radixserve.options.errors import ServerArgsError

_ROUTED = "--enable-return-routed-experts"

# (dest, option, why): settings whose steps the routed-experts capture does not see.
_NOT_WITH_ROUTED_EXPERTS = (
    ("pp_size", "--pp-size", "each pipeline stage routes only its own layers"),
)

# --eplb-algorithm values this runtime runs, all with its one balanced packing
# (layers/moe/placement.rebalance): one node, no expert groups to keep together, so SGLang's
# hierarchical variant places as the flat one does.
EPLB_ALGORITHMS = ("auto", "deepseek", "deepseek_hierarchical")

# (dest, option, rule text) of settings that must be > 0 when given.
_POSITIVE = (
    ("eplb_rebalance_num_iterations", "--eplb-rebalance-num-iterations", "forward passes"),
    ("eplb_rebalance_layers_per_chunk", "--eplb-rebalance-layers-per-chunk", "layers"),
)


def _check_eplb(v: Mapping[str, Any]) -> None:
    """Expert placement: redundant slots, a starting placement and the rebalancer need
    expert parallelism (one EP rank holds every expert: there is nothing to place)."""
    ep = v.get("ep_size", 1) or 1
    redundant = v.get("ep_num_redundant_experts") or 0
    if redundant < 0:
        raise ServerArgsError("--ep-num-redundant-experts", f"must be >= 0, got {redundant}")
    placed = {
        "--ep-num-redundant-experts": redundant > 0,
        "--enable-eplb": bool(v.get("enable_eplb")),
        "--init-expert-location": (v.get("init_expert_location") or "trivial") != "trivial",
    }
    for option, used in placed.items():
        if used and ep == 1:
            raise ServerArgsError(
                option,
                "needs --ep-size > 1: expert placement spreads experts over expert-parallel "
                "ranks, and with --ep-size 1 every rank holds every expert",
            )
    for dest, option, what in _POSITIVE:
        value = v.get(dest)
        if value is not None and value <= 0:
            raise ServerArgsError(option, f"must be > 0 {what}, got {value}")
    algorithm = v.get("eplb_algorithm") or "auto"
    if algorithm not in EPLB_ALGORITHMS:
        raise ServerArgsError(
            "--eplb-algorithm",
            f"{algorithm!r} is not supported (supported: {', '.join(EPLB_ALGORITHMS)}; all run "
            "one balanced packing)",
        )
    threshold = v.get("eplb_min_rebalancing_utilization_threshold")
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        raise ServerArgsError(
            "--eplb-min-rebalancing-utilization-threshold",
            f"must be within 0..1 (a balancedness: mean over max rank load), got {threshold}",
        )
    if v.get("enable_eplb") and (v.get("pp_size") or 1) > 1:
        raise ServerArgsError(
            "--enable-eplb",
            "cannot be combined with --pp-size > 1 yet: the weight moves run over one "
            "pipeline stage's tensor-parallel group only",
        )


def check_moe(v: Mapping[str, Any]) -> None:
    """Raise ServerArgsError for a MoE setting that cannot run here."""
    _check_eplb(v)
    if not v.get("enable_return_routed_experts"):
        return
    for dest, option, why in _NOT_WITH_ROUTED_EXPERTS:
        value = v.get(dest)
        if value and not (dest == "pp_size" and value == 1):
            raise ServerArgsError(_ROUTED, f"cannot be combined with {option} yet ({why})")
