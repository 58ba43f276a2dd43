"""Switches a model's norms and activations between the reference PyTorch ops (bit-for-bit
HF transformers in float32) and the fused kernels of radixserve.kernels."""

from __future__ import annotations

import logging

import torch
from torch import nn

from radixserve.kernels import ops
from radixserve.layers.activation import SiluAndMul
from radixserve.layers.layernorm import RMSNorm

logger = logging.getLogger(__name__)

_FUSABLE = (RMSNorm, SiluAndMul)


def use_fast_kernels(model: nn.Module, enabled: bool) -> int:
    """Set the fused-kernel switch on every fusable module; returns how many were switched.
    Decoder layers that llama_layer can run whole also get its static arguments, fused_args
    (call this again after changing a model's weights' form, e.g. GGUF quantization)."""
    from radixserve.layers.fused_decoder import fusable, fused_layer_args
    from radixserve.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear

    # Float matmuls of the decoder go through kernels.ops.float_linear (a packed kernel where it
    # measured faster than torch's BLAS); the LM head keeps F.linear.
    linears = (ReplicatedLinear, ColumnParallelLinear, RowParallelLinear)
    count = 0
    float_weights = False
    for module in model.modules():
        if isinstance(module, linears):
            module.use_fast_kernels = enabled
            weight = getattr(module, "weight", None)
            is_float32 = weight is not None and weight.dtype == torch.float32
            float_weights |= getattr(module, "gguf", None) is None and is_float32
        elif isinstance(module, _FUSABLE):
            module.use_fast_kernels = enabled
            count += 1
        elif hasattr(type(module), "fused_args"):  # a decoder layer that offers the fused call
            module.fused_args = fused_layer_args(module) if enabled and fusable(module) else None
    if enabled and float_weights:
        logger.info("%s", ops.tune_float_gemm())
    return count
