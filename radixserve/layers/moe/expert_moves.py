"""Move a MoE layer's expert weights to a new placement (placement.py) across the EP ranks.

Every rank runs the same plan (the placements are computed identically everywhere), so the
collectives pair up without any message saying what to do:
- a slot whose expert this rank already held is copied from its own stacks;
- a slot whose expert it did not hold is received by torch.distributed broadcast from the lowest
  EP rank that held it, one broadcast per MoE-TP rank (each MoE-TP rank holds its own slice of
  the intermediate dimension, so slice j comes from the holder's MoE-TP rank j).

The stacks moved are whatever holds the experts along dim 0: the float weights and biases, or
the GGUF blocks (methods.GGUFExpertsMethod), so both forms move the same way.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from radixserve.distributed import parallel_state as ps
from radixserve.layers.moe.fused_moe import FusedMoE
from radixserve.layers.moe.methods import GGUFExpertsMethod
from radixserve.layers.moe.placement import LayerPlacement

# (tensor to send or receive into, source TP rank) -> the tensor as broadcast.
Broadcast = Callable[[torch.Tensor, int], torch.Tensor]

_FLOAT_STACKS = ("w13_weight", "w2_weight", "w13_bias", "w2_bias")


def expert_stacks(layer: FusedMoE) -> list[torch.Tensor]:
    """The layer's tensors with one entry per local slot along dim 0."""
    method = layer.quant_method
    if isinstance(method, GGUFExpertsMethod):
        return [p.blocks for p in (*method.gate_up_parts, method.down_part)]
    out = []
    for name in _FLOAT_STACKS:
        param = getattr(layer, name, None)
        if param is not None and param.numel() > 0:
            out.append(param.data)
    return out


def _replace_stacks(layer: FusedMoE, stacks: list[torch.Tensor]) -> None:
    method = layer.quant_method
    if isinstance(method, GGUFExpertsMethod):
        parts = (*method.gate_up_parts, method.down_part)
        moved = [p._replace(blocks=b) for p, b in zip(parts, stacks, strict=True)]
        layer.quant_method = GGUFExpertsMethod(tuple(moved[:-1]), moved[-1])
        for i, part in enumerate(moved):
            layer.register_buffer(f"gguf_expert_blocks_{i}", part.blocks, persistent=False)
        return
    held = iter(stacks)
    for name in _FLOAT_STACKS:
        param = getattr(layer, name, None)
        if param is not None and param.numel() > 0:
            # In place: the loader's and the optimiser-free module's references stay valid.
            param.data = next(held)


def transfers(old: LayerPlacement, new: LayerPlacement) -> list[tuple[int, int, int]]:
    """(logical expert, source EP rank, destination EP rank) for every expert a rank gains,
    in one order every rank agrees on."""
    out = []
    for dst in range(new.ep_size):
        had = set(old.local_logical(dst))
        for logical in sorted(set(new.local_logical(dst)) - had):
            src = old.rank_of(old.copies[logical][0])
            out.append((logical, src, dst))
    return out


def _tp_broadcast(tensor: torch.Tensor, src_tp_rank: int) -> torch.Tensor:
    ps.tensor_model_parallel_broadcast(tensor, src_tp_rank)
    return tensor


def move_layer(layer: FusedMoE, new: LayerPlacement, broadcast: Broadcast = _tp_broadcast) -> int:
    """Give `layer` the weights of `new` and route by it; the number of (expert, rank)
    transfers. Called on every TP rank with the same `new`."""
    old = layer.placement
    if (new.num_logical, new.num_physical, new.ep_size) != (
        old.num_logical,
        old.num_physical,
        old.ep_size,
    ):
        raise ValueError("a new placement must keep the layer's experts, slots and EP size")
    stacks = expert_stacks(layer)
    moe_tp = layer.moe_tp_size
    received: dict[int, list[torch.Tensor]] = {}
    plan = transfers(old, new)
    for logical, src, dst in plan:
        for j in range(moe_tp):
            me = layer.ep_rank == dst and layer.moe_tp_rank == j
            sender = layer.ep_rank == src and layer.moe_tp_rank == j
            got = []
            for stack in stacks:
                if sender:
                    buf = stack[old.local_logical(src).index(logical)].clone()
                else:
                    buf = torch.empty_like(stack[0])
                got.append(broadcast(buf, src * moe_tp + j))
            if me:
                received[logical] = got
    old_local = old.local_logical(layer.ep_rank)
    new_stacks = []
    for i, stack in enumerate(stacks):
        rows = []
        for logical in new.local_logical(layer.ep_rank):
            if logical in old_local:
                rows.append(stack[old_local.index(logical)])
            else:
                rows.append(received[logical][i])
        new_stacks.append(torch.stack(rows).contiguous())
    _replace_stacks(layer, new_stacks)
    layer.set_placement(new)
    return len(plan)


def moe_layers(model: nn.Module) -> dict[int, FusedMoE]:
    """The model's MoE layers by decoder layer index (after expert_stats.attach)."""
    return {
        m.layer_id: m for m in model.modules() if isinstance(m, FusedMoE) and m.layer_id is not None
    }
