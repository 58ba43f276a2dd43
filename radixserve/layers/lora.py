"""LoRA deltas added to a model's linear layers, per row group of a batch.

A batch may mix requests of several adapters and of the base model. Before each forward the
LoRA manager fills one shared `LoRABatchState` with the batch's segments: for every adapter
present, the device slot holding its weights and the flattened token rows that use it. Each
hooked linear layer then adds, for each segment, `x[rows] @ A^T @ B^T` to its base output (one
gathered matmul pair per adapter, never a forward per adapter). Rows of the base model get
nothing added.

A linear layer without a hook pays one attribute read (`lora is None`); models are only hooked
when the server runs with --enable-lora.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn


class LoRAWeights(NamedTuple):
    """One adapter's weights for one (possibly fused) linear layer.

    For a fused layer (qkv, gate_up) the sub-projections' A matrices are stacked,
    `a` [sum of ranks, in], and B is block-diagonal, `b` [out, sum of ranks]: the zero blocks
    contribute exact zeros, so each sub-projection's rows equal its own x @ A^T @ B^T. The
    delta is multiplied by `scaling` (alpha / r) last, in PEFT's order.
    """

    a: torch.Tensor
    b: torch.Tensor
    scaling: float


class LoRASegment(NamedTuple):
    slot: int
    rows: torch.Tensor  # int64 flattened token rows of the batch that use this adapter


@dataclass
class LoRABatchState:
    """The current batch's adapter segments, shared by every hook of one model."""

    segments: list[LoRASegment] = field(default_factory=list)


class SubProjection(NamedTuple):
    """Where a checkpoint projection (e.g. k_proj) sits inside our (fused) linear layer."""

    module: str  # our layer's attribute path inside a decoder layer, e.g. "self_attn.qkv_proj"
    offset: int  # first output row of this projection in the fused output
    out_features: int
    in_features: int


class LoRAHook:
    """Adds the segments' LoRA deltas to one linear layer's output."""

    def __init__(self, state: LoRABatchState) -> None:
        self.state = state
        self.slot_weights: dict[int, LoRAWeights] = {}

    def __call__(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        if not self.state.segments:
            return out
        flat_x = x.reshape(-1, x.shape[-1])
        flat_out = out.view(-1, out.shape[-1])  # a view: the deltas land in `out`
        for seg in self.state.segments:
            weights = self.slot_weights.get(seg.slot)
            if weights is None:  # this adapter does not target this layer
                continue
            rows_x = flat_x.index_select(0, seg.rows)
            delta = torch.matmul(torch.matmul(rows_x, weights.a.t()), weights.b.t())
            flat_out.index_add_(0, seg.rows, (delta * weights.scaling).to(flat_out.dtype))
        return out


# Checkpoint projection name -> (our module inside the decoder layer, index among its parts).
_ATTN = "self_attn"
_MLP = "mlp"


def decoder_sub_projections(layer: nn.Module) -> dict[str, SubProjection]:
    """The LoRA-targetable projections of a Llama-shaped decoder layer (layers/ may not import
    models/, so this reads the layer's attributes: self_attn.qkv_proj, o_proj, mlp.gate_up_proj,
    down_proj). A mixture-of-experts layer offers its attention projections only (its MLP has
    no dense gate|up and down)."""
    attn = layer.self_attn
    qkv = attn.qkv_proj
    hidden = qkv.input_size
    q_size = qkv.num_heads * qkv.head_size
    kv_size = qkv.num_kv_heads * qkv.head_size
    o_proj = attn.o_proj
    found = {
        "q_proj": SubProjection(f"{_ATTN}.qkv_proj", 0, q_size, hidden),
        "k_proj": SubProjection(f"{_ATTN}.qkv_proj", q_size, kv_size, hidden),
        "v_proj": SubProjection(f"{_ATTN}.qkv_proj", q_size + kv_size, kv_size, hidden),
        "o_proj": SubProjection(f"{_ATTN}.o_proj", 0, o_proj.output_size, o_proj.input_size),
    }
    gate_up = getattr(layer.mlp, "gate_up_proj", None)
    down = getattr(layer.mlp, "down_proj", None)
    if gate_up is None or down is None:
        return found
    inter = gate_up.output_sizes[0]
    return {
        **found,
        "gate_proj": SubProjection(f"{_MLP}.gate_up_proj", 0, inter, hidden),
        "up_proj": SubProjection(f"{_MLP}.gate_up_proj", inter, gate_up.output_sizes[1], hidden),
        "down_proj": SubProjection(f"{_MLP}.down_proj", 0, down.output_size, down.input_size),
    }


def attach_lora_hooks(
    layers: nn.ModuleList, state: LoRABatchState
) -> dict[tuple[int, str], LoRAHook]:
    """Give every targetable linear layer of every decoder layer a hook; keyed by
    (layer index, module path). Hooked layers no longer qualify for the one-call C++ decoder
    layer (layers/fused_decoder.py checks `lora`)."""
    hooks: dict[tuple[int, str], LoRAHook] = {}
    for index, layer in enumerate(layers):
        for sub in decoder_sub_projections(layer).values():
            key = (index, sub.module)
            if key in hooks:
                continue
            linear = layer.get_submodule(sub.module)
            if getattr(linear, "tp_size", 1) != 1:
                raise ValueError("LoRA adapters run with --tp-size 1 only")
            hook = LoRAHook(state)
            linear.lora = hook
            hooks[key] = hook
    return hooks
