"""A MoE block's constants for the one-call C++ decoder layer (layers/fused_decoder.py): the
router's weight and the experts' GGUF blocks, which kernels/csrc/moe_layer.cpp runs with the
same calls as FusedMoE does from Python (the same bits, without a dozen Python calls a layer)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from radixserve.kernels import ops
from radixserve.layers.activation import SiluAndMul
from radixserve.layers.linear import fused_operands
from radixserve.layers.moe.fused_moe import FusedMoE
from radixserve.layers.moe.methods import GGUFExpertsMethod
from radixserve.layers.moe.router import Scoring


class MoECallArgs(NamedTuple):
    """LlamaLayerChain.set_moe's arguments after the layer index."""

    router: torch.Tensor
    router_qtype: int  # -1: a float weight
    top_k: int
    renormalize: bool
    gate_up: list[torch.Tensor]
    gate_up_qtypes: list[int]
    down: torch.Tensor
    down_qtype: int


def moe_call_args(block: nn.Module) -> MoECallArgs | None:
    """The C++ layer's view of a sparse MLP block (models/moe_common.SparseMoeBlock: `gate`,
    `experts`, `shared_expert`), or None where it cannot run it: a shared expert, float or
    non-native expert weights, what FusedMoE.fused_call_allowed refuses (expert biases,
    experts split over ranks, recording), a sigmoid, top-k-softmax or grouped router, a
    SiLU-less activation, a router that is not one plain weight (LoRA, bias, packed)."""
    experts = getattr(block, "experts", None)
    gate = getattr(block, "gate", None)
    if not isinstance(experts, FusedMoE) or gate is None:
        return None
    if getattr(block, "shared_expert", None) is not None or not experts.fused_call_allowed():
        return None
    method = experts.quant_method
    if not isinstance(method, GGUFExpertsMethod) or not isinstance(experts.act, SiluAndMul):
        return None
    parts = (*method.gate_up_parts, method.down_part)
    if not all(ops.gguf_kernel_type(p.qtype) for p in parts):
        return None
    if experts.router.scoring is not Scoring.SOFTMAX:
        return None
    # The C++ router knows plain top-k only (no expert groups, no scaling factor).
    if experts.router.num_groups > 1 or experts.router.scaling_factor != 1.0:
        return None
    operands = fused_operands(gate)
    if operands is None or len(operands.weights) != 1 or gate.bias is not None:
        return None
    return MoECallArgs(
        router=operands.weights[0],
        router_qtype=operands.qtypes[0],
        top_k=experts.router.top_k,
        renormalize=experts.router.renormalize,
        gate_up=[p.blocks for p in method.gate_up_parts],
        gate_up_qtypes=[p.qtype for p in method.gate_up_parts],
        down=method.down_part.blocks,
        down_qtype=method.down_part.qtype,
    )
