"""The quantization method a linear layer holds: how its weight is stored and multiplied.

Each linear layer (and the embedding / LM head, which multiplies like one) owns one
`LinearMethod` in `quant_method` (vLLM's pattern): the method creates the layer's weights,
may turn them into another form once loaded, and runs the matmul. The layer's forward calls
`quant_method.apply`; the code that needs to know a weight's form (the one-call C++ decoder
layer, the startup kernel choices, memory accounting) asks the method through the typed
queries below, never attributes hung on the module.

A layer's method changes only at well-defined moments, by replacing the object: at load
(GGUF blocks, quantize-on-load), and when the fast path packs weights for another kernel
(`unpacked()` gives back the method the packed copy was made from).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import nn

from radixserve.kernels import ops

if TYPE_CHECKING:
    from radixserve.layers.quantization.gguf import GGUFWeight

# The one-call C++ decoder layer's qtype for a plain float weight.
FLOAT_WEIGHT = -1


class FusedOperands(NamedTuple):
    """A projection as the one-call C++ decoder layer takes it: one weight (or GGUF blocks) per
    part and its qtype (FLOAT_WEIGHT for float). More than one part only for a fused layer whose
    parts have different GGUF block types."""

    weights: tuple[torch.Tensor, ...]
    qtypes: tuple[int, ...]


class LinearMethod(ABC):
    """How one layer holds its weight and computes x @ W^T (+ bias)."""

    def create_weights(self, layer: nn.Module, output_size: int, input_size: int) -> None:  # noqa: B027
        """Register the parameters this method loads into on `layer` (before loading). Methods
        that take over already-loaded weights (GGUF blocks, packed copies) create none."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:  # noqa: B027
        """Called once the layer's weights are all loaded."""

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., in] @ W^T (+ bias) -> [..., out]."""

    def argmax(self, layer: nn.Module, x: torch.Tensor, columns: int) -> torch.Tensor:
        """Each row of x [rows, in]'s argmax over the first `columns` outputs of x @ W^T
        (greedy sampling's LM head; a method with a fused kernel never writes the outputs)."""
        return ops.argmax_rows(self.apply(layer, x, None)[:, :columns])

    def fused_operands(self, layer: nn.Module) -> FusedOperands | None:
        """The weight as the one-call C++ decoder layer multiplies it, or None when that layer
        cannot (weights packed for another library's kernel)."""
        return None

    def gguf_weight(self) -> GGUFWeight | None:
        """The GGUF blocks the weight is held as, if it is (a packed copy's source included)."""
        return None

    def unpacked(self) -> LinearMethod:
        """The method this one's packed copy was made from (itself when not a packed copy)."""
        return self

    def with_fast_kernels(self, enabled: bool) -> LinearMethod:
        """This method on radixserve's fused float kernels (or off them); methods without a
        choice return themselves."""
        return self


class MethodLayer(nn.Module):
    """A module whose matmul belongs to its `quant_method` (linear layers, the embedding table
    used as LM head, an EAGLE draft's partial head)."""

    quant_method: LinearMethod
