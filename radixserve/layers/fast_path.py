"""Switches a model's norms and activations between the reference PyTorch ops (bit-for-bit
HF transformers in float32) and the fused kernels of radixserve.kernels."""

from __future__ import annotations

import logging

import torch
from torch import nn

from radixserve.kernels import ops
from radixserve.kernels.onednn_linear import pack_weight, packing_support
from radixserve.layers.activation import SiluAndMul
from radixserve.layers.layernorm import RMSNorm

logger = logging.getLogger(__name__)

_FUSABLE = (RMSNorm, SiluAndMul)


def use_fast_kernels(model: nn.Module, enabled: bool, onednn_packing: bool = True) -> int:
    """Set the fused-kernel switch on every fusable module; returns how many were switched.
    Decoder layers that llama_layer can run whole also get its static arguments, fused_args
    (call this again after changing a model's weights' form, e.g. GGUF quantization). With
    `onednn_packing` (off under torch.compile, whose freezing packs), bfloat16 linear weights
    are pre-packed for oneDNN where the CPU allows it (kernels/onednn_linear.py)."""
    from radixserve.layers.fused_decoder import fusable, fused_layer_args
    from radixserve.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear

    # Float matmuls of the decoder go through kernels.ops.float_linear (a packed kernel where it
    # measured faster than torch's BLAS); the LM head keeps F.linear.
    linears = (ReplicatedLinear, ColumnParallelLinear, RowParallelLinear)
    # Before fused_args: layers with packed weights do not qualify for the one-call C++ layer.
    pack_for_onednn(model, linears, enabled and onednn_packing)
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


# The float dtype whose linear weights are pre-packed for oneDNN (kernels/onednn_linear.py):
# bfloat16, where eager F.linear re-packs per call. float32 keeps the C++ packed kernels (and the
# bitwise-HF reference path). Only on the fast path, and not under --enable-torch-compile (its
# freezing packs). Layers with packed weights run module by module: the one-call C++ decoder
# layer multiplies plain weights with its own kernels. The plain weights stay (the embedding
# table, the weight-update and get-weights APIs read them), so the weights' memory doubles.
ONEDNN_PACKED_DTYPE = torch.bfloat16


def pack_for_onednn(model: nn.Module, linears: tuple[type, ...], enabled: bool) -> int:
    """Pack a CPU model's ONEDNN_PACKED_DTYPE linear weights for oneDNN (or drop earlier packs
    when not `enabled`); logs what was done and why. Returns how many weights were packed."""
    dtype = ONEDNN_PACKED_DTYPE
    drop_packed_weights(model)
    if not enabled or not any(
        p.dim() == 2 and p.dtype == dtype and p.device.type == "cpu" for p in model.parameters()
    ):
        return 0
    supported, why_not = packing_support(dtype)
    if not supported:
        logger.info("%s linear weights not pre-packed for oneDNN: %s", dtype, why_not)
        return 0
    count = pack_linear_layers(model, linears, dtype)
    logger.info(
        "%s linear weights pre-packed for oneDNN: %d layers (decoder layers run module by module "
        "on oneDNN's matmul)",
        dtype,
        count,
    )
    return count


def pack_linear_layers(model: nn.Module, linears: tuple[type, ...], dtype: torch.dtype) -> int:
    """Pack the float weight of every `linears` module of `dtype` (and the LM head's) and drop
    earlier packs; returns how many were packed. GGUF-block, int8 and other-dtype layers are
    left as they are."""
    drop_packed_weights(model)
    head = getattr(model, "lm_head", None)
    count = 0
    for module in model.modules():
        if not (isinstance(module, linears) or module is head):
            continue
        weight = getattr(module, "weight", None)
        if getattr(module, "gguf", None) is not None or not isinstance(weight, torch.Tensor):
            continue
        if weight.dim() != 2 or weight.dtype != dtype or weight.device.type != "cpu":
            continue
        module.onednn = pack_weight(weight)
        count += 1
    return count


def drop_packed_weights(model: nn.Module) -> None:
    """Back to the plain weights everywhere (they were never changed)."""
    for module in model.modules():
        if "onednn" in module.__dict__:
            del module.onednn
