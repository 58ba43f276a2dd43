"""Switches a model's norms and activations between the reference PyTorch ops (bit-for-bit
HF transformers in float32) and the fused kernels of radixserve.kernels."""

from __future__ import annotations

from torch import nn

from radixserve.layers.activation import SiluAndMul
from radixserve.layers.layernorm import RMSNorm

_FUSABLE = (RMSNorm, SiluAndMul)


def use_fast_kernels(model: nn.Module, enabled: bool) -> int:
    """Set the fused-kernel switch on every fusable module; returns how many were switched.
    Decoder layers that llama_layer can run whole also get its static arguments, fused_args
    (call this again after changing a model's weights' form, e.g. GGUF quantization)."""
    from radixserve.layers.fused_decoder import fusable, fused_layer_args

    count = 0
    for module in model.modules():
        if isinstance(module, _FUSABLE):
            module.use_fast_kernels = enabled
            count += 1
        elif hasattr(type(module), "fused_args"):  # a decoder layer that offers the fused call
            module.fused_args = fused_layer_args(module) if enabled and fusable(module) else None
    return count
