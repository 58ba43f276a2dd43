"""Linear layers that shard over tensor-parallel ranks.

Every parameter carries a `weight_loader(param, loaded_weight, shard_id=None)` that receives the
full checkpoint tensor and copies this rank's slice into the parameter. Fused layers (qkv,
gate_up) also carry `shard_ids` on their parameters: the shards a complete load must deliver.
How a layer holds its weight and multiplies by it is its `quant_method`
(layers/quantization/): float when built, GGUF blocks or packed copies once a loader or the
fast path gives it another.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from radixserve.layers.lora import LoRAHook

from radixserve.distributed import parallel_state as ps
from radixserve.layers.quantization import (
    FusedOperands,
    LinearMethod,
    MethodLayer,
    UnquantizedLinearMethod,
)

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


def linear_forward(layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ W^T (+ bias) by the layer's quantization method; plus the batch's LoRA deltas when
    the layer carries a LoRA hook (layers/lora.py, only with --enable-lora)."""
    out = layer.quant_method.apply(layer, x, bias)
    return out if layer.lora is None else layer.lora(x, out)


def fused_operands(linear: LinearBase) -> FusedOperands | None:
    """The weight as the one-call C++ decoder layer multiplies it (layers/fused_decoder.py),
    None where that layer cannot: a sharded weight, a LoRA hook (the C++ layer has no place to
    add the adapters' deltas, so --enable-lora runs decoder layers module by module), or a
    weight its method packed for another library's kernel."""
    if linear.tp_size != 1 or linear.lora is not None:
        return None
    return linear.quant_method.fused_operands(linear)


def _new_bias(size: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(size), requires_grad=False)


class LinearBase(MethodLayer):
    """What every linear layer has: its quantization method (float until a loader or the fast
    path gives it another, layers/quantization/), its rank count, and an optional LoRA hook."""

    tp_size: int = 1
    lora: LoRAHook | None = None  # set by layers.lora.attach_lora_hooks

    def __init__(self, input_size: int, output_size: int) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        self.quant_method: LinearMethod = UnquantizedLinearMethod()


class ReplicatedLinear(LinearBase):
    """A plain linear layer, the same on every rank."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__(input_size, output_size)
        self.quant_method.create_weights(self, output_size, input_size)
        self.weight.weight_loader = default_weight_loader
        self.bias = _new_bias(output_size) if bias else None
        if self.bias is not None:
            self.bias.weight_loader = default_weight_loader

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear_forward(self, x, self.bias)


class ColumnParallelLinear(LinearBase):
    """y = x W^T + b with W split by output rows: rank r holds rows [r*n, (r+1)*n).

    The output stays sharded (gather_output is not needed by the models here: a column layer is
    always followed by a row-parallel one or by per-head attention).
    """

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__(input_size, output_size)
        self.tp_rank = ps.get_tp_rank()
        self.tp_size = ps.get_tp_size()
        self.output_size_per_partition = ps.divide(output_size, self.tp_size, "output size")
        self.quant_method.create_weights(self, self.output_size_per_partition, input_size)
        self.weight.weight_loader = self.weight_loader
        self.bias = _new_bias(self.output_size_per_partition) if bias else None
        if self.bias is not None:
            self.bias.weight_loader = self.weight_loader

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        if shard_id is not None:
            raise ValueError(f"{type(self).__name__} is not fused; got shard_id {shard_id!r}")
        start, size = self.output_shard(None)
        copy_checked(param, loaded_weight.narrow(0, start, size))

    def output_shard(self, shard_id: object) -> tuple[int, int]:
        """(first row, rows) of this rank's slice of the checkpoint tensor for `shard_id`: the
        float loader and the GGUF block loader (models/gguf_shard.py) cut the same rows."""
        size = self.output_size_per_partition
        return self.tp_rank * size, size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear_forward(self, x, self.bias)


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
        start, size = self.output_shard(shard_id)
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size  # type: ignore[misc]
        target = param.data.narrow(0, offset, size)
        copy_checked(target, loaded_weight.narrow(0, start, size))

    def output_shard(self, shard_id: object) -> tuple[int, int]:
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(
                f"shard_id must be an index below {len(self.output_sizes)}, got {shard_id!r}"
            )
        size = self.output_sizes[shard_id] // self.tp_size
        return self.tp_rank * size, size


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
        src_start, size = self.output_shard(shard_id)
        offset = {"q": 0, "k": q_size, "v": q_size + kv_size}[shard_id]  # type: ignore[index]
        target = param.data.narrow(0, offset, size)
        copy_checked(target, loaded_weight.narrow(0, src_start, size))

    def output_shard(self, shard_id: object) -> tuple[int, int]:
        if shard_id == "q":
            q_size = self.num_heads * self.head_size
            return self.tp_rank * q_size, q_size
        if shard_id in ("k", "v"):
            kv_size = self.num_kv_heads * self.head_size
            return (self.tp_rank // self.kv_replicas) * kv_size, kv_size
        raise ValueError(f"shard_id must be 'q', 'k' or 'v', got {shard_id!r}")


class RowParallelLinear(LinearBase):
    """y = x W^T + b with W split by input columns; partial sums are all-reduced.

    The input is expected already sharded (the output of a column-parallel layer). The bias is
    added once, after the reduction.
    """

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__(input_size, output_size)
        self.tp_rank = ps.get_tp_rank()
        self.tp_size = ps.get_tp_size()
        self.input_size_per_partition = ps.divide(input_size, self.tp_size, "input size")
        self.quant_method.create_weights(self, output_size, self.input_size_per_partition)
        self.weight.weight_loader = self.weight_loader
        self.bias = _new_bias(output_size) if bias else None
        if self.bias is not None:
            self.bias.weight_loader = default_weight_loader

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        if shard_id is not None:
            raise ValueError(f"RowParallelLinear is not fused; got shard_id {shard_id!r}")
        start, size = self.input_shard()
        copy_checked(param, loaded_weight.narrow(1, start, size))

    def input_shard(self) -> tuple[int, int]:
        """(first column, columns) of this rank's slice of the checkpoint's input dimension
        (the float loader and the GGUF block loader cut the same columns)."""
        size = self.input_size_per_partition
        return self.tp_rank * size, size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return linear_forward(self, x, self.bias)
        # Sharded: float weights only (quantization runs with one rank), through the layer's
        # method (the fast path's kernels, batch-invariant under deterministic inference);
        # the bias is added once, after the reduction.
        out = ps.tensor_model_parallel_all_reduce(self.quant_method.apply(self, x, None))
        if self.bias is not None:
            out = out + self.bias
        return out
