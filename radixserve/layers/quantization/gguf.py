"""Weights kept as GGUF blocks (--quantization gguf, and the blocks quantize-on-load makes):
multiplied by radixserve's integer kernels (kernels.ops.gguf_linear), never expanded whole."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from radixserve.kernels import ops
from radixserve.layers.quantization.base import FusedOperands, LinearMethod

# GGUFWeight.qtype of a layer whose parts use different block types (see GGUFWeight.parts).
MIXED_GGUF_TYPES = -1


class GGUFWeight(NamedTuple):
    """A weight kept as GGUF blocks: uint8 [out_features, bytes].

    A fused layer whose parts use different block types (q|k|v with a Q6_K v) has qtype
    MIXED_GGUF_TYPES, empty blocks and one GGUFWeight per part in `parts`, run one by one."""

    blocks: torch.Tensor
    qtype: int
    out_features: int
    parts: tuple[GGUFWeight, ...] = ()

    def pieces(self) -> tuple[GGUFWeight, ...]:
        """The parts multiplied one by one (the weight itself when of one type)."""
        return self.parts or (self,)


@dataclass(frozen=True, eq=False)
class GGUFLinearMethod(LinearMethod):
    """x @ W^T on the blocks, part by part for a fused layer of mixed types."""

    weight: GGUFWeight

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        gguf = self.weight
        flat = x.reshape(-1, x.shape[-1])
        if gguf.parts:
            out = torch.cat(
                [ops.gguf_linear(flat, p.blocks, p.qtype, p.out_features) for p in gguf.parts],
                dim=-1,
            )
        else:
            out = ops.gguf_linear(flat, gguf.blocks, gguf.qtype, gguf.out_features)
        out = out.reshape(*x.shape[:-1], gguf.out_features)
        return out if bias is None else out + bias

    def argmax(self, layer: nn.Module, x: torch.Tensor, columns: int) -> torch.Tensor:
        gguf = self.weight
        if gguf.parts:
            return super().argmax(layer, x, columns)
        return ops.gguf_linear_argmax(x, gguf.blocks, gguf.qtype, gguf.out_features, columns)

    def fused_operands(self, layer: nn.Module) -> FusedOperands | None:
        parts = self.weight.pieces()
        for part in parts:
            if not ops.gguf_kernel_type(part.qtype) or part.blocks.shape[0] != part.out_features:
                return None  # a type the C++ layer does not decode: module by module
        return FusedOperands(tuple(p.blocks for p in parts), tuple(p.qtype for p in parts))

    def gguf_weight(self) -> GGUFWeight | None:
        return self.weight


def use_gguf_blocks(
    layer: nn.Module, parts: Sequence[tuple[torch.Tensor, int]]
) -> GGUFLinearMethod:
    """Make `layer` multiply by GGUF blocks given part by part (rows stacked in order; parts of
    one block type are joined into one matrix) and drop its float weight. The blocks must
    describe exactly the float weight's rows. They are also the layer's buffers, so module-wide
    walks (memory accounting, .to()) see them."""
    weight = layer.weight
    rows = sum(blocks.shape[0] for blocks, _ in parts)
    if rows != weight.shape[0]:
        raise ValueError(f"GGUF blocks have {rows} rows, the layer {weight.shape[0]}")
    if len({qtype for _, qtype in parts}) == 1:
        blocks = parts[0][0] if len(parts) == 1 else torch.cat([b for b, _ in parts])
        layer.register_buffer("gguf_blocks", blocks, persistent=False)
        gguf = GGUFWeight(blocks, parts[0][1], rows)
    else:
        pieces = []
        for i, (blocks, qtype) in enumerate(parts):
            layer.register_buffer(f"gguf_blocks_{i}", blocks, persistent=False)
            pieces.append(GGUFWeight(blocks, qtype, blocks.shape[0]))
        empty = torch.empty(0, 0, dtype=torch.uint8)
        gguf = GGUFWeight(empty, MIXED_GGUF_TYPES, rows, tuple(pieces))
    method = GGUFLinearMethod(gguf)
    layer.quant_method = method
    # In place: the loader's table of parameters holds this same object, so replacing the
    # attribute alone would keep the float storage alive until loading ended.
    weight.data = torch.empty(0, dtype=weight.dtype)
    # The loader's completeness check skips it (its values came as blocks).
    weight.held_as_blocks = True
    return method
