"""Gated activations applied to a fused [gate | up] projection."""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.kernels import ops

logger = logging.getLogger(__name__)


class SiluAndMul(nn.Module):
    """silu(x[..., :d]) * x[..., d:] for x of last dimension 2d (gate first, then up)."""

    use_fast_kernels = False  # set by layers.fast_path

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_fast_kernels and x.dim() == 2:
            return ops.silu_and_mul(x)
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]


class GeluTanhAndMul(nn.Module):
    """gelu(x[..., :d], tanh approximation) * x[..., d:] (transformers' gelu_pytorch_tanh, the
    Gemma 2/3 MLP). Plain PyTorch: there is no fused kernel for it, and the one-call C++ decoder
    layer, which has SiLU only, leaves layers with it alone."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.gelu(x[..., :d], approximate="tanh") * x[..., d:]


class ClampedSwiGLU(nn.Module):
    """gpt-oss's expert activation on [gate | up] halves (the loader de-interleaves the
    checkpoint's alternating gate/up columns into halves): gate clamped above at `limit`, up
    clamped to [-limit, limit], then (up + 1) * gate * sigmoid(alpha * gate). Plain PyTorch:
    no fused kernel has the clamps or the +1, so FusedMoE's SiLU fast paths leave it alone."""

    def __init__(self, alpha: float = 1.702, limit: float = 7.0) -> None:
        super().__init__()
        self.alpha = alpha
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        gate = x[..., :d].clamp(max=self.limit)
        up = x[..., d:].clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))


_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "silu": SiluAndMul,
    "gelu_pytorch_tanh": GeluTanhAndMul,
}


def get_act_and_mul(name: str) -> nn.Module:
    """The gated activation for config.hidden_act."""
    try:
        return _ACTIVATIONS[name]()
    except KeyError:
        supported = ", ".join(sorted(_ACTIVATIONS))
        raise ValueError(f"hidden_act {name!r} is not supported; supported: {supported}") from None
