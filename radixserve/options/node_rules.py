"""Multi-node rules (--nnodes, --node-rank): each node runs tp_size / nnodes ranks and all of
them meet at --dist-init-addr, which a node cannot guess for the others."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from radixserve.options.errors import ServerArgsError


def check_nodes(v: Mapping[str, Any]) -> None:
    nnodes = v.get("nnodes", 1)
    node_rank = v.get("node_rank", 0)
    tp = v.get("tp_size", 1)
    if nnodes < 1:
        raise ServerArgsError("--nnodes", f"must be >= 1, got {nnodes}")
    if not 0 <= node_rank < nnodes:
        raise ServerArgsError(
            "--node-rank", f"must be between 0 and --nnodes - 1 ({nnodes - 1}), got {node_rank}"
        )
    if nnodes == 1:
        return
    if not v.get("dist_init_addr"):
        raise ServerArgsError(
            "--dist-init-addr",
            f"is required with --nnodes {nnodes}: give every node the same HOST:PORT of node 0",
        )
    if tp % nnodes:
        raise ServerArgsError(
            "--tp-size",
            f"{tp} does not split over --nnodes {nnodes} (each node runs tp-size / nnodes "
            "ranks); use a multiple of the node count",
        )
    for dest, option in (("dp_size", "--dp-size"), ("pp_size", "--pp-size")):
        if v.get(dest, 1) > 1:
            raise ServerArgsError(option, f"cannot be combined with --nnodes {nnodes} yet")
