"""Switches a model's norms and activations between the reference PyTorch ops (bit-for-bit
HF transformers in float32) and the fused kernels of radixserve.kernels."""

from __future__ import annotations

import logging
import os

import torch
from torch import nn

from radixserve.kernels import ops
from radixserve.kernels.build import load_extension
from radixserve.kernels.cpu_features import cpu_features
from radixserve.kernels.onednn_linear import pack_weight, packing_support
from radixserve.layers.activation import SiluAndMul
from radixserve.layers.kquant_paths import choose_kquant_paths
from radixserve.layers.layernorm import RMSNorm
from radixserve.layers.linear import LinearBase
from radixserve.layers.quantization import (
    GGUFLinearMethod,
    GGUFWeight,
    LinearMethod,
    MethodLayer,
    UnquantizedLinearMethod,
)
from radixserve.layers.quantization.packed import Int4PackLinearMethod, OneDNNLinearMethod
from radixserve.layers.remembered_timing import remembered_figures
from radixserve.layers.timing import interleaved_fastest
from radixserve.layers.vision_linears import use_fast_vision_linears

logger = logging.getLogger(__name__)

_FUSABLE = (RMSNorm, SiluAndMul)


def use_fast_kernels(
    model: nn.Module, enabled: bool, repack_weights: bool = True, deterministic: bool = False
) -> int:
    """Set the fused-kernel switch on every fusable module; returns how many were switched.
    Decoder layers that llama_layer can run whole also get its static arguments, fused_args
    (call this again after changing a model's weights' form, e.g. GGUF quantization). With
    `repack_weights` (off under torch.compile, whose freezing packs), bfloat16 linear weights
    are pre-packed for oneDNN where the CPU allows it (kernels/onednn_linear.py), and GGUF Q4_1
    layers take PyTorch's packed int4 matmul where it measures faster (kernels/int4pack.py)."""
    from radixserve.layers.fused_decoder import fusable, fused_layer_args

    # Float matmuls of the decoder go through kernels.ops.float_linear (a packed kernel where it
    # measured faster than torch's BLAS); the LM head keeps F.linear. Every layer first goes
    # back to the method its weights were loaded in (dropping earlier packed copies).
    float_weights = False
    for module in model.modules():
        if isinstance(module, MethodLayer):
            method = module.quant_method.unpacked()
            if isinstance(module, LinearBase):
                method = method.with_fast_kernels(enabled)
                float_weights |= (
                    isinstance(method, UnquantizedLinearMethod)
                    and module.weight.dtype == torch.float32
                )
            module.quant_method = method
    linears = (LinearBase,)
    # Before fused_args: layers with packed weights do not qualify for the one-call C++ layer.
    # Deterministic inference keeps the radixserve kernels, whose rows do not depend on each
    # other (oneDNN's and torch's int4 packed matmuls block by the row count).
    repack = enabled and repack_weights and not deterministic
    pack_for_onednn(model, linears, repack)
    decoder_layers = [m for m in model.modules() if hasattr(type(m), "fused_args")]
    one_call = enabled and any(fusable(m) for m in decoder_layers)
    pack_q4_1_for_int4(model, linears, repack, keeps_one_call=one_call)
    choose_kquant_paths(model, linears, enabled, deterministic)
    vision_linears = use_fast_vision_linears(model, enabled)
    float_weights |= vision_linears > 0
    count = 0
    for module in model.modules():
        if isinstance(module, _FUSABLE):
            module.use_fast_kernels = enabled
            count += 1
        elif hasattr(type(module), "fused_args"):  # a decoder layer that offers the fused call
            module.fused_args = fused_layer_args(module) if enabled and fusable(module) else None
    if enabled and float_weights:
        logger.info("%s", ops.tune_float_gemm())
    if deterministic:
        _check_deterministic(model, enabled)
    ops.use_deterministic_kernels(deterministic)
    return count


def _check_deterministic(model: nn.Module, enabled: bool) -> None:
    """--enable-deterministic-inference holds for layers on GGUF blocks (the kernels give a row
    the same bits at any batch size) and for float32 weights on the packed float kernel, which
    use_deterministic_kernels makes every float32 matmul take (each output element sums K in
    one fixed order, whatever the row count; the LM head too, switched here). Torch's BLAS,
    oneDNN's bf16 packs and the 16-bit weight kernels block by the row count (0.1 logprob apart
    between a request alone and in a batch), so other float weights are refused rather than
    served nondeterministically."""
    if not enabled:
        raise ValueError("--enable-deterministic-inference needs the intel_amx kernels")
    lm_head = getattr(model, "lm_head", None)
    for name, module in model.named_modules():
        if not (isinstance(module, LinearBase) or module is lm_head):
            continue
        if not isinstance(module, MethodLayer) or module.quant_method.gguf_weight() is not None:
            continue
        problem = _float_weight_problem(module)
        if problem:
            raise ValueError(
                f"--enable-deterministic-inference: layer {name} {problem}; batch-invariant "
                "matmuls exist for GGUF blocks (a .gguf model, --quantization gguf) and float32 "
                "weights (--dtype float32)"
            )
        if module is lm_head:
            module.quant_method = module.quant_method.with_fast_kernels(True)


def _float_weight_problem(module: MethodLayer) -> str | None:
    """Why a float layer's matmul cannot take the batch-invariant packed kernel, or None."""
    method = module.quant_method
    weight = getattr(module, "weight", None)
    if not isinstance(method, UnquantizedLinearMethod) or weight is None:
        return f"runs {type(method).__name__}, which has no batch-invariant kernel"
    if weight.dtype != torch.float32 or torch.get_default_dtype() != torch.float32:
        return f"holds {weight.dtype} weights under {torch.get_default_dtype()} activations"
    if weight.dim() != 2 or weight.shape[1] % 8:
        return f"has an input size ({weight.shape[-1]}) that is not a multiple of 8"
    ext = load_extension()
    if ext is None or not ext.float_packed_available():
        return "needs the packed float kernel (AVX2), which this CPU or build lacks"
    return None


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
    unpack(model, OneDNNLinearMethod)
    compute = getattr(getattr(model, "config", None), "dtype", dtype)
    if compute != dtype:  # 16-bit weights under float32 compute: widened as multiplied instead
        return 0
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
    """Pack the float weight of every `linears` module of `dtype` (and the LM head's); returns
    how many were packed. GGUF-block, int8 and other-dtype layers are left as they are."""
    head = getattr(model, "lm_head", None)
    count = 0
    for module in model.modules():
        if not isinstance(module, MethodLayer) or not (
            isinstance(module, linears) or module is head
        ):
            continue
        method = module.quant_method
        if not isinstance(method, UnquantizedLinearMethod):
            continue  # GGUF blocks, a packed copy already
        weight = module.weight
        if weight.dim() != 2 or weight.dtype != dtype or weight.device.type != "cpu":
            continue
        module.quant_method = OneDNNLinearMethod(pack_weight(weight), method)
        count += 1
    return count


def unpack(model: nn.Module, kind: type[LinearMethod]) -> None:
    """Put every layer whose method is a `kind` packed copy back on the method it was made
    from (its weights were never changed)."""
    for module in model.modules():
        if isinstance(module, MethodLayer) and isinstance(module.quant_method, kind):
            module.quant_method = module.quant_method.unpacked()


# --quantization gguf's Q4_1 layers on PyTorch's packed int4 matmul (kernels/int4pack.py):
# "auto" where the CPU has bfloat16 units and it measures faster than our integer kernels on
# the model's own weights, "1" wherever PyTorch runs it, "0" never.
INT4_ENV = "RADIXSERVE_GGUF_INT4"
INT4_MIN_GAIN = 1.1


def pack_q4_1_for_int4(
    model: nn.Module, linears: tuple[type, ...], enabled: bool, keeps_one_call: bool = False
) -> int:
    """Give the model's Q4_1 GGUF layers packed int4 weights where that path is chosen (or
    drop earlier ones); logs the choice and why. Returns how many layers got one.
    `keeps_one_call`: the decoder layers would otherwise run as one C++ call each (and as one
    chain at batch 1), which packed layers give up; then the integer kernels stay, whatever
    one matmul measures: on the default model (AVX512-BF16/AMX Xeon) the int4 matmul measured
    1.14x our kernel alone while batch-1 decode ran 85 against 125 tok/s with it."""
    from radixserve.kernels.int4pack import Q4_1, int4pack_support, pack_q4_1, packable

    unpack(model, Int4PackLinearMethod)
    layers: list[tuple[LinearBase, GGUFLinearMethod]] = [
        (m, m.quant_method)
        for m in model.modules()
        if isinstance(m, linears)
        and isinstance(m, LinearBase)
        and isinstance(m.quant_method, GGUFLinearMethod)
        and m.quant_method.weight.qtype == Q4_1
        and packable(m.quant_method.weight.out_features)
        and m.tp_size == 1
    ]
    if not enabled or not layers:
        return 0
    mode = os.environ.get(INT4_ENV, "auto")
    supported, why_not = int4pack_support()
    if mode == "0" or not supported:
        if mode != "0":
            logger.info("GGUF Q4_1 on radixserve's integer kernels (int4 matmul: %s)", why_not)
        return 0
    if mode != "1" and keeps_one_call:
        logger.info(
            "GGUF Q4_1 on radixserve's integer kernels: the decoder layers run as one C++ call, "
            "which PyTorch's int4 matmul would give up (%s=1 forces it)",
            INT4_ENV,
        )
        return 0
    if mode != "1":
        bf16 = cpu_features().bf16_flags
        if not bf16:
            logger.info(
                "GGUF Q4_1 on radixserve's integer kernels (no AVX512-BF16/AMX-BF16 for "
                "PyTorch's bfloat16 int4 matmul)"
            )
            return 0
        largest = max((g.weight for _, g in layers), key=lambda w: w.blocks.numel())
        shape = "x".join(str(d) for d in largest.blocks.shape)
        figures, note = remembered_figures(
            "int4-gain",
            load_extension(),
            [shape, str(INT4_MIN_GAIN)],
            lambda: {"gain": _int4_gain(largest)},
        )
        gain = figures["gain"]
        if gain < INT4_MIN_GAIN:
            logger.info(
                "GGUF Q4_1 on radixserve's integer kernels: PyTorch's int4 matmul measured "
                "%.2fx of their speed on this model's largest layer (%s; %s)",
                gain,
                ", ".join(bf16),
                note,
            )
            return 0
        reason = (
            f"{gain:.2f}x faster than radixserve's integer kernels here ({', '.join(bf16)}; {note})"
        )
    else:
        reason = f"{INT4_ENV}=1"
    for module, method in layers:
        module.quant_method = Int4PackLinearMethod(pack_q4_1(method.weight.blocks), method)
    logger.info(
        "GGUF Q4_1 on PyTorch's packed int4 matmul, bfloat16 activations: %d layers (%s; they "
        "run module by module)",
        len(layers),
        reason,
    )
    return len(layers)


def _int4_gain(gguf: GGUFWeight, rounds: int = 5) -> float:
    """Our integer kernel's time over the int4 matmul's on a layer's Q4_1 weight, at 1 and 8
    rows (decode), fastest of `rounds` interleaved rounds."""
    from radixserve.kernels.int4pack import int4pack_linear, pack_q4_1

    weight = pack_q4_1(gguf.blocks)
    total = {"ours": 0.0, "int4": 0.0}
    for rows in (1, 8):
        x = torch.randn(rows, weight.in_features)
        fastest = interleaved_fastest(
            {
                "ours": lambda x=x: ops.gguf_linear(x, gguf.blocks, gguf.qtype, gguf.out_features),
                "int4": lambda x=x: int4pack_linear(x, weight),
            },
            rounds,
        )
        for name, seconds in fastest.items():
            total[name] += seconds
    return total["ours"] / max(total["int4"], 1e-9)
