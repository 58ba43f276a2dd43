"""RMSNorm, optionally fused with the residual add that precedes it; one split over TP ranks;
Gemma's, whose weights are offsets from 1."""

from __future__ import annotations

import logging

import torch
from torch import nn

from radixserve.distributed import parallel_state as ps
from radixserve.kernels import ops
from radixserve.layers.linear import copy_checked, default_weight_loader

logger = logging.getLogger(__name__)


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 and cast back (as HF Llama does).

    With `residual`, returns (norm(x + residual), x + residual): the sum is the next residual.
    With use_fast_kernels (set by layers.fast_path), one fused kernel does it and may reuse the
    memory of x and residual for its results.
    """

    use_fast_kernels = False

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.variance_epsilon = eps
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)
        self.weight.weight_loader = default_weight_loader

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        input_dtype = x.dtype
        x32 = x.to(torch.float32)
        variance = x32.pow(2).mean(-1, keepdim=True)
        x32 = x32 * torch.rsqrt(variance + self.variance_epsilon)
        # Cast before scaling: the same rounding order as the reference implementation.
        return self.weight * x32.to(input_dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if self.use_fast_kernels and x.dim() == 2:
            if residual is None:
                return ops.rms_norm(x, self.weight, self.variance_epsilon)
            return ops.fused_add_rms_norm(x, residual, self.weight, self.variance_epsilon)
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x


class ShardedRMSNorm(RMSNorm):
    """RMSNorm over a vector whose parts are split over the tensor-parallel ranks (OLMo 2's
    q and k norms span every head; each rank holds `hidden_size` of the vector and the slice of
    the weight starting at `weight_start`).

    On one rank it is a plain RMSNorm (the same kernels, bitwise the reference). On several,
    the mean of squares is summed over all ranks' parts: when a part is replicated on several
    ranks (kv heads fewer than ranks), every part is counted equally often, so the mean holds.
    """

    def __init__(self, hidden_size: int, eps: float, weight_start: int) -> None:
        super().__init__(hidden_size, eps)
        self.tp_size = ps.get_tp_size()
        self.weight_start = weight_start
        self.weight.weight_loader = self.weight_loader

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        if shard_id is not None:
            raise ValueError(f"ShardedRMSNorm is not fused; got shard_id {shard_id!r}")
        copy_checked(param, loaded_weight.narrow(0, self.weight_start, self.hidden_size))

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if self.tp_size == 1:
            return super().forward(x, residual)
        if residual is not None:
            raise ValueError("ShardedRMSNorm does not fuse a residual add")
        x32 = x.to(torch.float32)
        squares = ps.tensor_model_parallel_all_reduce(x32.pow(2).sum(-1, keepdim=True))
        x32 = x32 * torch.rsqrt(squares / (self.hidden_size * self.tp_size) + self.variance_epsilon)
        return self.weight * x32.to(x.dtype)


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm: x / rms(x) * (1 + weight). Gemma checkpoints store each weight as its
    offset from 1, and transformers scales in float32 before casting back (Llama's casts first,
    so the two round differently in 16-bit dtypes).

    The fused kernels compute x / rms(x) * w in float32, which for float32 inputs is this norm
    with w = 1 + weight; other dtypes take the PyTorch path for the reference's rounding.
    """

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if self.use_fast_kernels and x.dim() == 2 and x.dtype == torch.float32:
            # Recomputed per call (hidden_size adds): a kept copy would go stale when the
            # weights are updated in place.
            scale = 1.0 + self.weight.float()
            if residual is None:
                return ops.rms_norm(x, scale, self.variance_epsilon)
            return ops.fused_add_rms_norm(x, residual, scale, self.variance_epsilon)
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x
