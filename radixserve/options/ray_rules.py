"""--use-ray rules: what the Ray launch (distributed/ray_launch.py) runs with, and what it does
not run with yet (each refused with the option that conflicts)."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from radixserve.options.errors import ServerArgsError


def check_ray(v: Mapping[str, Any]) -> None:
    if not v.get("use_ray"):
        return
    if v.get("device") != "cpu":
        # Only the CPU (gloo) launch has been run; GPU placement by Ray (a GPU per actor,
        # CUDA_VISIBLE_DEVICES set by Ray) is untested here, so it is not offered.
        raise ServerArgsError(
            "--use-ray",
            f"runs CPU ranks only for now (--device cpu), got --device {v.get('device')}",
        )
    for dest, option in (("dp_size", "--dp-size"), ("nnodes", "--nnodes")):
        if v.get(dest, 1) > 1:
            why = (
                "Ray places the ranks on the cluster's machines; start one server"
                if dest == "nnodes"
                else "data-parallel replicas are not launched as Ray actors yet"
            )
            raise ServerArgsError("--use-ray", f"cannot be combined with {option} > 1 ({why})")
    if importlib.util.find_spec("ray") is None:
        raise ServerArgsError(
            "--use-ray", "needs the ray package: pip install 'radixserve[ray]' (or pip install ray)"
        )
