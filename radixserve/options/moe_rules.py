"""Mixture-of-experts rules: --enable-return-routed-experts and what it runs with."""

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


def check_moe(v: Mapping[str, Any]) -> None:
    """Raise ServerArgsError for a MoE setting that cannot run here."""
    if not v.get("enable_return_routed_experts"):
        return
    for dest, option, why in _NOT_WITH_ROUTED_EXPERTS:
        value = v.get(dest)
        if value and not (dest == "pp_size" and value == 1):
            raise ServerArgsError(_ROUTED, f"cannot be combined with {option} yet ({why})")
