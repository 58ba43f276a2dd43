"""Copies of a layer's weight packed for another library's matmul, made by layers/fast_path.py
at startup where they measure faster; each keeps the method it was made from (`unpacked`), which
the fast path restores before choosing again."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from radixserve.kernels.int4pack import Int4PackWeight, int4pack_linear
from radixserve.kernels.onednn_linear import OneDNNWeight, onednn_linear
from radixserve.layers.quantization.base import LinearMethod
from radixserve.layers.quantization.gguf import GGUFLinearMethod, GGUFWeight


@dataclass(frozen=True, eq=False)
class OneDNNLinearMethod(LinearMethod):
    """A bfloat16 weight pre-packed for oneDNN (kernels/onednn_linear.py); the plain weight
    stays on the layer for the embedding table and the weights APIs."""

    packed: OneDNNWeight
    source: LinearMethod

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return onednn_linear(x, self.packed, bias)

    def unpacked(self) -> LinearMethod:
        return self.source


@dataclass(frozen=True, eq=False)
class Int4PackLinearMethod(LinearMethod):
    """GGUF Q4_1 blocks repacked for PyTorch's int4 matmul (kernels/int4pack.py; bfloat16
    activations). The blocks stay (the source method holds them)."""

    packed: Int4PackWeight
    source: GGUFLinearMethod

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return int4pack_linear(x, self.packed, bias)

    def gguf_weight(self) -> GGUFWeight | None:
        return self.source.weight

    def unpacked(self) -> LinearMethod:
        return self.source
