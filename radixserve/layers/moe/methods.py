"""How a MoE layer holds its stacked expert weights and multiplies one expert's rows by them:
the experts' counterpart of layers/quantization's linear methods (create the weights, run the
matmul; a loader replaces the method when the weights arrive in another form).

Both projections are stacked with the experts along dim 0: gate|up [experts, 2 * inter, hidden]
(gate rows first) and down [experts, hidden, inter]. An expert's slice of either is a plain
[out, in] matrix (float) or a run of whole GGUF block rows, so one expert's matmul reads that
expert's bytes and nothing else: at batch 1 only the selected experts' weights are touched.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.kernels import ops
from radixserve.kernels.build import load_extension
from radixserve.layers.weight_storage import weight_dtype


class ExpertsMethod(ABC):
    """One expert's projections over the rows routed to it."""

    def create_weights(self, layer: nn.Module, experts: int, hidden: int, inter: int) -> None:  # noqa: B027
        """Register the parameters this method loads into (methods that take over loaded
        weights, like GGUF blocks, create none)."""

    @abstractmethod
    def gate_up(self, layer: nn.Module, expert: int, x: torch.Tensor) -> torch.Tensor:
        """x [rows, hidden] -> [rows, 2 * inter], gate columns first."""

    @abstractmethod
    def down(self, layer: nn.Module, expert: int, x: torch.Tensor) -> torch.Tensor:
        """x [rows, inter] -> [rows, hidden]."""

    def block_bytes(self) -> int:
        """Bytes of GGUF blocks the experts are held as (0 for float weights)."""
        return 0

    def few_rows(
        self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor | None:
        """A few rows [T, H] through their chosen experts ([T, k] ids and weights, silu
        gated) in one fused call, the grouped loop's sums; None where this form or this
        many rows has none (the caller runs the grouped loop)."""
        return None


class UnquantizedExpertsMethod(ExpertsMethod):
    """Float stacked weights `w13_weight` and `w2_weight`, multiplied with F.linear per expert
    (16-bit stored weights under float32 activations are widened as used, like the linear
    layers' float method)."""

    def create_weights(self, layer: nn.Module, experts: int, hidden: int, inter: int) -> None:
        dtype = weight_dtype()
        layer.w13_weight = nn.Parameter(
            torch.empty(experts, 2 * inter, hidden, dtype=dtype), requires_grad=False
        )
        layer.w2_weight = nn.Parameter(
            torch.empty(experts, hidden, inter, dtype=dtype), requires_grad=False
        )

    def gate_up(self, layer: nn.Module, expert: int, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, layer.w13_weight[expert].to(x.dtype))

    def down(self, layer: nn.Module, expert: int, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, layer.w2_weight[expert].to(x.dtype))


class ExpertBlocks(NamedTuple):
    """One stacked projection (or one part of gate|up) as GGUF blocks: uint8
    [experts, rows, row bytes]; blocks[e] is expert e's [rows, row bytes] block matrix."""

    blocks: torch.Tensor
    qtype: int
    rows: int


@dataclass(frozen=True, eq=False)
class GGUFExpertsMethod(ExpertsMethod):
    """Experts kept as the file's blocks, multiplied by the same kernels as the linear layers'
    blocks (kernels.ops.gguf_linear). gate|up is one part when gate and up share a block
    type, else two, run one after the other."""

    gate_up_parts: tuple[ExpertBlocks, ...]
    down_part: ExpertBlocks

    def gate_up(self, layer: nn.Module, expert: int, x: torch.Tensor) -> torch.Tensor:
        outs = [ops.gguf_linear(x, p.blocks[expert], p.qtype, p.rows) for p in self.gate_up_parts]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)

    def down(self, layer: nn.Module, expert: int, x: torch.Tensor) -> torch.Tensor:
        p = self.down_part
        return ops.gguf_linear(x, p.blocks[expert], p.qtype, p.rows)

    def block_bytes(self) -> int:
        return sum(p.blocks.numel() for p in (*self.gate_up_parts, self.down_part))

    def few_rows(
        self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor | None:
        """kernels/csrc/moe.cpp's moe_rows_gguf up to its row limit (the one-call C++ layer
        takes it for the same batches, moe_layer.cpp, so both give the same bits)."""
        ext = self._extension(x)
        if ext is None or x.shape[0] > ext.moe_rows_max_tokens or weights.dtype != x.dtype:
            return None
        return ext.moe_rows_gguf(
            x,
            experts,
            weights,
            [p.blocks for p in self.gate_up_parts],
            [p.qtype for p in self.gate_up_parts],
            self.down_part.blocks,
            self.down_part.qtype,
        )

    def _extension(self, x: torch.Tensor) -> object | None:
        """The C++ extension where its MoE kernels run this layer and x: float32 rows, every
        part a type with a kernel."""
        if x.dtype != torch.float32 or not x.is_contiguous():
            return None
        parts = (*self.gate_up_parts, self.down_part)
        if not all(ops.gguf_kernel_type(p.qtype) for p in parts):
            return None
        ext = load_extension()
        if ext is None or not hasattr(ext, "moe_rows_gguf"):
            return None
        return ext


def use_gguf_experts(
    layer: nn.Module, gate_up: list[ExpertBlocks], down: ExpertBlocks
) -> GGUFExpertsMethod:
    """Put `layer` (a FusedMoE) on GGUF blocks and drop its float weights. gate|up parts
    of one block type are joined into one stacked tensor along the rows. Blocks of every
    expert are cut to the layer's own slots (--ep-size, --ep-num-redundant-experts): copies of
    the experts it holds only, so the rest of the stack (a file mapping, or the bytes read) is
    not kept."""
    experts, inter2, hidden = layer.w13_weight.shape
    local = tuple(getattr(layer, "local_logical", range(experts)))
    if local != tuple(range(down.blocks.shape[0])):
        index = torch.tensor(local, dtype=torch.long)
        gate_up = [p._replace(blocks=p.blocks.index_select(0, index)) for p in gate_up]
        down = down._replace(blocks=down.blocks.index_select(0, index))
    if sum(p.rows for p in gate_up) != inter2 or down.rows != hidden:
        raise ValueError(
            f"GGUF expert blocks have {[p.rows for p in gate_up]} + {down.rows} rows, the layer "
            f"{inter2} + {hidden}"
        )
    for part in (*gate_up, down):
        if part.blocks.dim() != 3 or part.blocks.shape[:2] != (experts, part.rows):
            raise ValueError(f"GGUF expert blocks {tuple(part.blocks.shape)} are not per expert")
    if len(gate_up) > 1 and len({p.qtype for p in gate_up}) == 1:
        joined = torch.cat([p.blocks for p in gate_up], dim=1)
        gate_up = [ExpertBlocks(joined, gate_up[0].qtype, inter2)]
    for i, part in enumerate((*gate_up, down)):
        # Buffers, so module-wide walks (memory accounting, .to()) see them.
        layer.register_buffer(f"gguf_expert_blocks_{i}", part.blocks, persistent=False)
    method = GGUFExpertsMethod(tuple(gate_up), down)
    layer.quant_method = method
    for param in (layer.w13_weight, layer.w2_weight):
        # In place: the loader's table of parameters holds these objects.
        param.data = torch.empty(0, dtype=param.dtype)
        param.held_as_blocks = True  # the loader's completeness check skips them
    return method
