"""--disaggregation-mode rules: what a prefill or decode server runs with (managers/disagg_*.py)
and what it does not run with yet, each refused naming the option that conflicts."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from radixserve.options.errors import ServerArgsError

MOONCAKE_HINT = (
    "needs Mooncake's transfer engine: pip install 'radixserve[disaggregation]' "
    "(mooncake-transfer-engine-non-cuda without CUDA, mooncake-transfer-engine with it)"
)

# (dest, option, why): settings a PD server refuses.
_REFUSED: tuple[tuple[str, str, str], ...] = (
    ("tp_size", "--tp-size", "the KV of one rank only is transferred so far; use 1"),
    ("dp_size", "--dp-size", "one replica per PD server so far; use 1"),
    ("pp_size", "--pp-size", "one pipeline stage per PD server so far; use 1"),
    ("nnodes", "--nnodes", "a PD server runs on one machine (start one per machine)"),
)


def check_disaggregation(v: Mapping[str, Any]) -> None:
    mode = v.get("disaggregation_mode")
    if mode in (None, "null"):
        return
    for dest, option, why in _REFUSED:
        if (v.get(dest) or 1) > 1:
            raise ServerArgsError(
                "--disaggregation-mode", f"{mode} cannot be combined with {option} > 1 ({why})"
            )
    if v.get("speculative_algorithm"):
        raise ServerArgsError(
            "--disaggregation-mode",
            f"{mode} cannot be combined with --speculative-algorithm (the draft model's KV "
            "is not transferred)",
        )
    if v.get("is_embedding"):
        raise ServerArgsError(
            "--disaggregation-mode", "is for generation; an embedding server has no decode"
        )
    backend = v.get("disaggregation_transfer_backend")
    if backend in ("mooncake", "mooncake_tcp") and importlib.util.find_spec("mooncake") is None:
        raise ServerArgsError("--disaggregation-transfer-backend", f"{backend} {MOONCAKE_HINT}")
    port = v.get("disaggregation_bootstrap_port")
    if mode == "prefill" and (not isinstance(port, int) or not 0 < port < 65536):
        raise ServerArgsError(
            "--disaggregation-bootstrap-port", f"must be a TCP port in 1..65535, got {port!r}"
        )
