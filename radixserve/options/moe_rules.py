"""Mixture-of-experts rules: --enable-return-routed-experts and what it runs with, and the
expert-parallel load balancing options this runtime refuses, with the reason."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from radixserve.options.errors import ServerArgsError

_ROUTED = "--enable-return-routed-experts"

# (dest, option, why): settings whose steps the routed-experts capture does not see.
_NOT_WITH_ROUTED_EXPERTS = (
    (
        "speculative_algorithm",
        "--speculative-algorithm",
        "draft and verify steps run rows that are not the request's tokens",
    ),
    ("pp_size", "--pp-size", "each pipeline stage routes only its own layers"),
)

# SGLang's EPLB moves and replicates experts between expert-parallel ranks from their
# measured load; this runtime places experts once (one contiguous run per --ep-size rank).
_NO_EPLB = (
    "this runtime has no expert-parallel load balancing yet: experts are placed once, a "
    "contiguous run per --ep-size rank, and never moved or replicated"
)


def check_moe(v: Mapping[str, Any]) -> None:
    """Raise ServerArgsError for a MoE setting that cannot run here."""
    if v.get("enable_eplb"):
        raise ServerArgsError("--enable-eplb", f"not supported: {_NO_EPLB}")
    if v.get("ep_num_redundant_experts"):
        raise ServerArgsError(
            "--ep-num-redundant-experts",
            f"{v['ep_num_redundant_experts']} not supported (leave at 0): redundant expert "
            f"copies need load balancing, and {_NO_EPLB}",
        )
    if not v.get("enable_return_routed_experts"):
        return
    for dest, option, why in _NOT_WITH_ROUTED_EXPERTS:
        value = v.get(dest)
        if value and not (dest == "pp_size" and value == 1):
            raise ServerArgsError(_ROUTED, f"cannot be combined with {option} yet ({why})")
