"""RMSNorm, optionally fused with the residual add that precedes it."""

from __future__ import annotations

import logging

import torch
from torch import nn

from radixserve.kernels import ops
from radixserve.layers.linear import default_weight_loader

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
