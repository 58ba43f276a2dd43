"""Linear layers that shard over tensor-parallel ranks.

Every parameter carries a `weight_loader(param, loaded_weight, shard_id=None)` that receives the
full checkpoint tensor and copies this rank's slice into the parameter. Fused layers (qkv,
gate_up) also carry `shard_ids` on their parameters: the shards a complete load must deliver.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from radixserve.layers.lora import LoRAHook

from radixserve.distributed import parallel_state as ps
from radixserve.kernels import ops, reference
from radixserve.kernels.int4pack import Int4PackWeight, int4pack_linear
from radixserve.kernels.onednn_linear import OneDNNWeight, onednn_linear
from radixserve.layers.weight_storage import weight_dtype, widened

logger = logging.getLogger(__name__)


def copy_checked(param: torch.Tensor, loaded: torch.Tensor) -> None:
    """Copy `loaded` into `param`, refusing a shape mismatch instead of broadcasting."""
    if param.shape != loaded.shape:
        raise ValueError(
            f"shape mismatch: parameter {tuple(param.shape)} vs checkpoint {tuple(loaded.shape)}"
        )
    param.data.copy_(loaded)


def default_weight_loader(
    param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
) -> None:
    """Replicated parameters: the checkpoint tensor is copied whole."""
    if shard_id is not None:
        raise ValueError(f"parameter is not fused; got shard_id {shard_id!r}")
    copy_checked(param, loaded_weight)


# GGML block type id -> bytes per block of 32 weights, for the types the kernels run directly.
GGUF_BLOCK_BYTES = reference.BLOCK_BYTES


# GGUFWeight.qtype of a layer whose parts use different block types (see GGUFWeight.parts).
MIXED_GGUF_TYPES = -1


class GGUFWeight(NamedTuple):
    """A weight kept as GGUF blocks (--quantization gguf): uint8 [out_features, bytes].

    A fused layer whose parts use different block types (q|k|v with a Q6_K v) has qtype
    MIXED_GGUF_TYPES, empty blocks and one GGUFWeight per part in `parts`, run one by one."""

    blocks: torch.Tensor
    qtype: int
    out_features: int
    parts: tuple[GGUFWeight, ...] = ()


def attach_gguf_weight(
    layer: nn.Module, blocks: torch.Tensor, qtype: int, free_float: bool = True
) -> None:
    """Make `layer` multiply by GGUF blocks; its float weight is dropped unless still needed
    (a tied embedding table). Blocks must describe exactly the float weight's shape."""
    weight = layer.weight
    out_features = weight.shape[0]
    if blocks.shape[0] != out_features:
        raise ValueError(f"GGUF blocks have {blocks.shape[0]} rows, the layer {out_features}")
    layer.register_buffer("gguf_blocks", blocks, persistent=False)
    layer.gguf = GGUFWeight(blocks, qtype, out_features)
    if free_float:
        layer.weight = nn.Parameter(torch.empty(0, dtype=weight.dtype), requires_grad=False)


def attach_gguf_parts(layer: nn.Module, parts: Sequence[tuple[torch.Tensor, int]]) -> None:
    """Make `layer` multiply by GGUF blocks given part by part (rows stacked in order), and drop
    its float weight; parts of one block type are joined into one matrix."""
    weight = layer.weight
    rows = sum(blocks.shape[0] for blocks, _ in parts)
    if rows != weight.shape[0]:
        raise ValueError(f"GGUF blocks have {rows} rows, the layer {weight.shape[0]}")
    if len({qtype for _, qtype in parts}) == 1:
        blocks = parts[0][0] if len(parts) == 1 else torch.cat([b for b, _ in parts])
        attach_gguf_weight(layer, blocks, parts[0][1])
    else:
        pieces = []
        for i, (blocks, qtype) in enumerate(parts):
            layer.register_buffer(f"gguf_blocks_{i}", blocks, persistent=False)
            pieces.append(GGUFWeight(blocks, qtype, blocks.shape[0]))
        empty = torch.empty(0, 0, dtype=torch.uint8)
        layer.gguf = GGUFWeight(empty, MIXED_GGUF_TYPES, rows, tuple(pieces))
        layer.weight = nn.Parameter(torch.empty(0, dtype=weight.dtype), requires_grad=False)
    layer.weight.held_as_blocks = True


def quantized_or_float_linear(
    layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x @ W^T (+ bias), on GGUF blocks when the layer has them; plus the batch's LoRA deltas
    when the layer carries a LoRA hook (layers/lora.py, only with --enable-lora)."""
    out = _base_linear(layer, x, bias)
    lora = getattr(layer, "lora", None)
    return out if lora is None else lora(x, out)


def _base_linear(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    int4: Int4PackWeight | None = getattr(layer, "int4", None)  # layers/fast_path.py
    if int4 is not None:
        return int4pack_linear(x, int4, bias)
    gguf: GGUFWeight | None = getattr(layer, "gguf", None)
    if gguf is None:
        packed: OneDNNWeight | None = getattr(layer, "onednn", None)  # kernels/onednn_linear.py
        if packed is not None:
            return onednn_linear(x, packed, bias)
        if widened(layer.weight, x.dtype):  # 16-bit weights, float32 activations
            if getattr(layer, "use_fast_kernels", False):
                flat = ops.half_weight_linear(x.reshape(-1, x.shape[-1]), layer.weight, bias)
                return flat.reshape(*x.shape[:-1], flat.shape[-1])
            return F.linear(x, layer.weight.to(x.dtype), bias)  # exact: HF's float32 weights
        if getattr(layer, "use_fast_kernels", False):  # set by layers.fast_path
            return ops.float_linear(x, layer.weight, bias)
        return F.linear(x, layer.weight, bias)
    flat = x.reshape(-1, x.shape[-1])
    if gguf.parts:
        out = torch.cat(
            [ops.gguf_linear(flat, p.blocks, p.qtype, p.out_features) for p in gguf.parts], dim=-1
        )
    else:
        out = ops.gguf_linear(flat, gguf.blocks, gguf.qtype, gguf.out_features)
    out = out.reshape(*x.shape[:-1], gguf.out_features)
    return out if bias is None else out + bias


def _new_param(*shape: int, weight: bool = False) -> nn.Parameter:
    # torch.empty: the checkpoint overwrites everything, so initialising would be wasted work.
    # A weight may be stored 16-bit under float32 compute (layers/weight_storage.py).
    dtype = weight_dtype() if weight else torch.get_default_dtype()
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


class ReplicatedLinear(nn.Module):
    """A plain linear layer, the same on every rank."""

    lora: LoRAHook | None = None  # set by layers.lora.attach_lora_hooks

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        self.weight = _new_param(output_size, input_size, weight=True)
        self.weight.weight_loader = default_weight_loader
        self.bias = _new_param(output_size) if bias else None
        if self.bias is not None:
            self.bias.weight_loader = default_weight_loader

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return quantized_or_float_linear(self, x, self.bias)


class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with W split by output rows: rank r holds rows [r*n, (r+1)*n).

    The output stays sharded (gather_output is not needed by the models here: a column layer is
    always followed by a row-parallel one or by per-head attention).
    """

    lora: LoRAHook | None = None  # set by layers.lora.attach_lora_hooks

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__()
        self.tp_rank = ps.get_tp_rank()
        self.tp_size = ps.get_tp_size()
        self.input_size = input_size
        self.output_size = output_size
        self.output_size_per_partition = ps.divide(output_size, self.tp_size, "output size")
        self.weight = _new_param(self.output_size_per_partition, input_size, weight=True)
        self.weight.weight_loader = self.weight_loader
        self.bias = _new_param(self.output_size_per_partition) if bias else None
        if self.bias is not None:
            self.bias.weight_loader = self.weight_loader

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        if shard_id is not None:
            raise ValueError(f"{type(self).__name__} is not fused; got shard_id {shard_id!r}")
        size = param.shape[0]
        copy_checked(param, loaded_weight.narrow(0, self.tp_rank * size, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return quantized_or_float_linear(self, x, self.bias)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of one input fused into a single matmul.

    Each rank's weight is [shard 0 slice; shard 1 slice; ...]; shard_id is the index into
    `output_sizes` (e.g. 0 = gate_proj, 1 = up_proj).
    """

    def __init__(self, input_size: int, output_sizes: Sequence[int], bias: bool = False) -> None:
        self.output_sizes = list(output_sizes)
        super().__init__(input_size, sum(self.output_sizes), bias)
        for size in self.output_sizes:
            ps.divide(size, self.tp_size, "merged output size")
        shard_ids = tuple(range(len(self.output_sizes)))
        for param in self.parameters():
            param.shard_ids = shard_ids

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(
                f"shard_id must be an index below {len(self.output_sizes)}, got {shard_id!r}"
            )
        size = self.output_sizes[shard_id] // self.tp_size
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        target = param.data.narrow(0, offset, size)
        copy_checked(target, loaded_weight.narrow(0, self.tp_rank * size, size))


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections fused: each rank holds its query heads and its kv heads.

    When there are fewer kv heads than ranks, each kv head is replicated on
    tp_size / num_kv_heads consecutive ranks. shard_id is "q", "k" or "v".
    """

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        total_num_heads: int,
        total_num_kv_heads: int,
        bias: bool = False,
    ) -> None:
        tp_size = ps.get_tp_size()
        self.head_size = head_size
        self.total_num_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads
        self.num_heads = ps.divide(total_num_heads, tp_size, "number of attention heads")
        if tp_size >= total_num_kv_heads:
            ps.divide(tp_size, total_num_kv_heads, "tp size over kv heads")
            self.num_kv_heads = 1
            self.kv_replicas = tp_size // total_num_kv_heads
        else:
            self.num_kv_heads = ps.divide(total_num_kv_heads, tp_size, "number of kv heads")
            self.kv_replicas = 1
        output_size = (self.num_heads + 2 * self.num_kv_heads) * tp_size * head_size
        super().__init__(hidden_size, output_size, bias)
        for param in self.parameters():
            param.shard_ids = ("q", "k", "v")

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        q_size = self.num_heads * self.head_size
        kv_size = self.num_kv_heads * self.head_size
        if shard_id == "q":
            offset, size, src_start = 0, q_size, self.tp_rank * q_size
        elif shard_id in ("k", "v"):
            offset = q_size if shard_id == "k" else q_size + kv_size
            size = kv_size
            src_start = (self.tp_rank // self.kv_replicas) * kv_size
        else:
            raise ValueError(f"shard_id must be 'q', 'k' or 'v', got {shard_id!r}")
        target = param.data.narrow(0, offset, size)
        copy_checked(target, loaded_weight.narrow(0, src_start, size))


class RowParallelLinear(nn.Module):
    """y = x W^T + b with W split by input columns; partial sums are all-reduced.

    The input is expected already sharded (the output of a column-parallel layer). The bias is
    added once, after the reduction.
    """

    lora: LoRAHook | None = None  # set by layers.lora.attach_lora_hooks (tp 1 only)

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__()
        self.tp_rank = ps.get_tp_rank()
        self.tp_size = ps.get_tp_size()
        self.input_size = input_size
        self.output_size = output_size
        self.input_size_per_partition = ps.divide(input_size, self.tp_size, "input size")
        self.weight = _new_param(output_size, self.input_size_per_partition, weight=True)
        self.weight.weight_loader = self.weight_loader
        self.bias = _new_param(output_size) if bias else None
        if self.bias is not None:
            self.bias.weight_loader = default_weight_loader

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        if shard_id is not None:
            raise ValueError(f"RowParallelLinear is not fused; got shard_id {shard_id!r}")
        size = param.shape[1]
        copy_checked(param, loaded_weight.narrow(1, self.tp_rank * size, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return quantized_or_float_linear(self, x, self.bias)
        out = ps.tensor_model_parallel_all_reduce(F.linear(x, self.weight))
        if self.bias is not None:
            out = out + self.bias
        return out
