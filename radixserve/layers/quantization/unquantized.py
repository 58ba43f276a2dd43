"""Float weights: F.linear, or radixserve's fused float kernels on the fast path. A 16-bit
weight under float32 activations (layers/weight_storage.py) is widened as it is multiplied."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.kernels import ops
from radixserve.layers.quantization.base import FLOAT_WEIGHT, FusedOperands, LinearMethod
from radixserve.layers.weight_storage import weight_dtype, widened


@dataclass(frozen=True)
class UnquantizedLinearMethod(LinearMethod):
    """`layer.weight` [out, in] as it was loaded. `fast_kernels` (set by layers/fast_path.py):
    ops.float_linear / ops.half_weight_linear instead of PyTorch's F.linear, which is
    bit-for-bit HF transformers in float32."""

    fast_kernels: bool = False

    def create_weights(self, layer: nn.Module, output_size: int, input_size: int) -> None:
        # torch.empty: the checkpoint overwrites everything, so initialising would be wasted
        # work. The weight may be stored 16-bit under float32 compute (weight_storage.py).
        layer.weight = nn.Parameter(
            torch.empty(output_size, input_size, dtype=weight_dtype()), requires_grad=False
        )

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        weight = layer.weight
        if widened(weight, x.dtype):  # 16-bit weights, float32 activations
            if self.fast_kernels:
                flat = ops.half_weight_linear(x.reshape(-1, x.shape[-1]), weight, bias)
                return flat.reshape(*x.shape[:-1], flat.shape[-1])
            return F.linear(x, weight.to(x.dtype), bias)  # exact: HF's float32 weights
        if self.fast_kernels:
            return ops.float_linear(x, weight, bias)
        return F.linear(x, weight, bias)

    def fused_operands(self, layer: nn.Module) -> FusedOperands | None:
        weight = layer.weight
        if weight.dim() != 2:
            return None
        return FusedOperands((weight,), (FLOAT_WEIGHT,))

    def with_fast_kernels(self, enabled: bool) -> LinearMethod:
        return self if self.fast_kernels == enabled else replace(self, fast_kernels=enabled)
