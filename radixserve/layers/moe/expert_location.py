"""--init-expert-location: the placement the MoE layers start from.

As SGLang accepts it: `trivial` (slot p holds expert p mod experts), or a .pt file, a .json file
or an inline JSON object holding either
- `physical_to_logical_map`: [layers, physical experts] (the model's decoder layers; the rows
  of dense layers are ignored), used as given; or
- `logical_count`: [layers, experts] routing counts (or [windows, layers, experts], summed),
  such as a /dump_expert_distribution_record file: each layer placed by placement.rebalance.
Anything else is refused with the keys found.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from radixserve.layers.moe.fused_moe import FusedMoE
from radixserve.layers.moe.placement import LayerPlacement, placement_from_map, rebalance
from radixserve.options.errors import ServerArgsError

_OPTION = "--init-expert-location"


def _read(spec: str) -> dict[str, Any]:
    try:
        if spec.lstrip().startswith("{"):
            data = json.loads(spec)
        elif spec.endswith(".pt"):
            data = torch.load(spec, weights_only=True)
        elif spec.endswith(".json"):
            data = json.loads(Path(spec).read_text())
        else:
            raise ServerArgsError(
                _OPTION, f"{spec!r} is not trivial, a .pt or .json file, or an inline JSON object"
            )
    except (OSError, ValueError, RuntimeError) as exc:
        raise ServerArgsError(_OPTION, f"cannot read {spec!r}: {exc}") from exc
    if not isinstance(data, dict):
        raise ServerArgsError(_OPTION, f"{spec!r} holds a {type(data).__name__}, not a dict")
    return data


def initial_placements(spec: str, layers: dict[int, FusedMoE]) -> dict[int, LayerPlacement]:
    """Each MoE layer's starting placement (layer id -> placement); {} for `trivial`."""
    if spec == "trivial":
        return {}
    data = _read(spec)
    if "physical_to_logical_map" in data:
        rows = torch.as_tensor(data["physical_to_logical_map"])
        make = _from_map
    elif "logical_count" in data:
        rows = torch.as_tensor(data["logical_count"])
        if rows.dim() == 3:  # SGLang's per-window buffer: the windows summed
            rows = rows.sum(dim=0)
        make = _from_counts
    else:
        raise ServerArgsError(
            _OPTION,
            f"unknown format (keys {sorted(data)}): give physical_to_logical_map or logical_count",
        )
    if rows.dim() != 2 or rows.shape[0] <= max(layers, default=-1):
        raise ServerArgsError(
            _OPTION,
            f"a [layers, experts] table covering the model's layers is needed, got shape "
            f"{tuple(rows.shape)}",
        )
    try:
        return {layer_id: make(rows[layer_id], layer) for layer_id, layer in layers.items()}
    except ValueError as exc:
        raise ServerArgsError(_OPTION, str(exc)) from exc


def _from_map(row: torch.Tensor, layer: FusedMoE) -> LayerPlacement:
    return placement_from_map(
        row.tolist(), layer.num_experts, layer.num_physical_experts, layer.ep_size
    )


def _from_counts(row: torch.Tensor, layer: FusedMoE) -> LayerPlacement:
    if row.numel() != layer.num_experts:
        raise ValueError(
            f"logical_count rows have {row.numel()} experts, the model {layer.num_experts}"
        )
    return rebalance(row[: layer.num_experts].double(), layer.num_physical_experts, layer.ep_size)
