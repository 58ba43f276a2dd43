"""Resolve every "auto"/unset option to a concrete value that fits the device.

Works on a plain {dest: value} dict so ServerArgs can resolve before it freezes. SGLang does the
same in ``ServerArgs.__post_init__``; the rules below follow it (see sglang-surface 1.5) except
where a CPU needs different numbers, which is said where it happens.
"""

from __future__ import annotations

import importlib.util
import logging
import random
from pathlib import Path
from typing import Any, NamedTuple

from radixserve.options import hardware

logger = logging.getLogger(__name__)

_MIB = 1 << 20
_GIB = 1 << 30

# SGLang's table keyed by device memory in GiB: (upper bound, chunked prefill, decode graph bs).
_CUDA_TABLE = ((20, 2048, 8), (35, 2048, 24), (60, 4096, 32), (90, 8192, 256), (160, 8192, 256))
_CUDA_LARGEST = (16384, 512)
_UNKNOWN_MEMORY = (4096, 160)
_UNKNOWN_MEM_FRACTION = 0.88

# On a CPU prefill is compute-bound well below SGLang's 2048-16384 token chunks, so bigger chunks
# add no throughput but stall every running decode for the whole chunk; 512 keeps them moving.
CPU_CHUNKED_PREFILL_SIZE = 512
# Weights plus KV pool on a CPU: half the RAM, but never more than 16 GiB by default, so a big
# host does not pre-allocate a KV pool far beyond any realistic load (raise it with
# --mem-fraction-static or --max-total-tokens).
CPU_MEM_FRACTION = 0.5
CPU_STATIC_BUDGET_BYTES = 16 * _GIB

_DTYPE_ALIASES = {
    "half": "float16",
    "float16": "float16",
    "float": "float32",
    "float32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
}


# Parser names SGLang renamed; it translates the old ones with a warning, and so do we.
_RENAMED_TOOL_CALL_PARSERS = {"qwen25": "qwen", "glm45": "glm"}


class Resolution(NamedTuple):
    """Resolved values plus what "auto" picked for hardware-only knobs (for the warning check)."""

    values: dict[str, Any]
    auto: dict[str, Any]


def _cuda_row(memory: int | None) -> tuple[int, int]:
    if memory is None:
        return _UNKNOWN_MEMORY
    size_gib = memory / _GIB
    for bound, chunk, graph_bs in _CUDA_TABLE:
        if size_gib < bound:
            return chunk, graph_bs
    return _CUDA_LARGEST


def default_chunked_prefill_size(device: str, memory: int | None) -> int:
    if device == "cpu":
        return CPU_CHUNKED_PREFILL_SIZE
    return _cuda_row(memory)[0]


def default_mem_fraction_static(
    device: str, memory: int | None, chunked_prefill_size: int, tp_size: int, pp_size: int
) -> float:
    """SGLang's reserve formula on CUDA; a RAM budget on CPU (see CPU_STATIC_BUDGET_BYTES)."""
    if memory is None or memory <= 0:
        return _UNKNOWN_MEM_FRACTION
    if device == "cpu":
        return round(min(CPU_MEM_FRACTION, CPU_STATIC_BUDGET_BYTES / memory), 3)
    memory_mib = memory / _MIB
    # Activations of one prefill chunk, the runtime, and NCCL buffers. No CUDA-graph reserve:
    # radixserve captures no graphs.
    reserved = 512 + max(chunked_prefill_size, 2048) * 1.5 + tp_size * pp_size / 8 * 1024
    if memory_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((memory_mib - reserved) / memory_mib, 3)


def default_cuda_graph_max_bs(device: str, memory: int | None, torch_compile_max_bs: int) -> int:
    # On CPU SGLang's decode "graphs" are torch.compile graphs bounded by torch_compile_max_bs.
    if device == "cpu":
        return torch_compile_max_bs
    return _cuda_row(memory)[1]


def resolve_dtype(dtype: str, device: str) -> str:
    """'auto' -> bfloat16 where the hardware computes it natively (on a CPU: and a probe measured
    it faster than float32), else float16 (CUDA) / float32 (CPU)."""
    if dtype != "auto":
        return _DTYPE_ALIASES.get(dtype, dtype)
    if device == "cuda":
        return "bfloat16" if hardware.cuda_supports_bf16() else "float16"
    return hardware.cpu_auto_dtype().dtype


# SGLang's 8-bit KV cache names -> the torch dtypes their codes are stored as.
_KV_FP8_DTYPES = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}


def resolve_kv_cache_dtype(kv_cache_dtype: str, dtype: str) -> str:
    """'auto' follows the model dtype; 'bf16' is spelled 'bfloat16'; fp8_e4m3 / fp8_e5m2 are
    float8_e4m3fn / float8_e5m2 (scaled 8-bit codes: model_executor/kv_scales.py)."""
    if kv_cache_dtype == "auto":
        return dtype
    if kv_cache_dtype in _KV_FP8_DTYPES:
        return _KV_FP8_DTYPES[kv_cache_dtype]
    return _DTYPE_ALIASES.get(kv_cache_dtype, kv_cache_dtype)


def default_served_model_name(model_path: str) -> str:
    """The name /v1/models shows when --served-model-name is not given: a local folder's or
    GGUF file's own name (SGLang shows the path as typed, which exposes the host's directory
    layout and keeps a trailing slash); anything else (a hub id) as given. Requests naming the
    path itself are still accepted (HttpConfig.model_aliases)."""
    local = Path(model_path).expanduser()
    if not local.exists():
        return model_path
    name = local.resolve().name
    return name[: -len(".gguf")] if local.is_file() and name.endswith(".gguf") else name


def _resolve_model(values: dict[str, Any]) -> None:
    if values.get("model_path") is None:
        from radixserve.default_model import DEFAULT_MODEL_NAME, ensure_default_model

        values["model_path"] = str(ensure_default_model())
        if values.get("served_model_name") is None:
            values["served_model_name"] = DEFAULT_MODEL_NAME
    model_path = values["model_path"]
    if values.get("tokenizer_path") is None:
        values["tokenizer_path"] = model_path
    if values.get("served_model_name") is None:
        values["served_model_name"] = default_served_model_name(str(model_path))
    # SGLang also switches to the GGUF loader when handed a .gguf file.
    if values.get("load_format") == "auto" and str(model_path).endswith(".gguf"):
        values["load_format"] = "gguf"


def _resolve_gguf_quantization(values: dict[str, Any]) -> None:
    """A .gguf model runs on its quantized blocks unless told otherwise, as SGLang (and vLLM)
    set --quantization gguf for a GGUF file: ~4x the batch-1 decode speed of the float weights
    dequantised from it. Only where those kernels run (the CPU, one TP rank, one pipeline
    stage); elsewhere, and with --quantization unquant, the blocks are dequantised to --dtype
    (exact: HF transformers' arithmetic in float32)."""
    if values.get("quantization") is not None or values.get("load_format") != "gguf":
        return
    if not str(values.get("model_path", "")).endswith(".gguf"):
        return
    blockers = []
    if values["device"] != "cpu":
        blockers.append(f"--device {values['device']}")
    if (values.get("pp_size") or 1) > 1:  # (tensor parallel ranks cut the blocks)
        blockers.append(f"--pp-size {values['pp_size']}")
    if blockers:
        logger.info(
            "GGUF model: weights dequantised to --dtype (the GGUF kernels do not run with %s)",
            ", ".join(blockers),
        )
        return
    values["quantization"] = "gguf"
    logger.info(
        "GGUF model: running on its quantized blocks (--quantization gguf, as SGLang does for a "
        ".gguf file); --quantization unquant dequantises them to --dtype instead"
    )


# The kernels radixserve has; any other SGLang kernel name (flashinfer, triton, fa3, ...) is
# mapped to the one that runs here, with one warning, so SGLang command lines start as they are.
ATTENTION_KERNELS = ("torch_native", "intel_amx")
SAMPLING_KERNELS = ("pytorch",)


def _map_kernel(values: dict[str, Any], dest: str, available: tuple[str, ...], to: str) -> None:
    chosen = values.get(dest)
    if chosen is None or chosen in available:
        return
    option = "--" + dest.replace("_", "-")
    logger.warning(
        "%s %s: that kernel is not part of radixserve; using %s instead (the same computation).",
        option,
        chosen,
        to,
    )
    values[dest] = to


def _resolve_backends(values: dict[str, Any]) -> None:
    # On CPU the fused C++ kernels (SGLang's CPU backend name); elsewhere the PyTorch ops.
    default_attention = "intel_amx" if values.get("device") == "cpu" else "torch_native"
    for dest in ("attention_backend", "prefill_attention_backend", "decode_attention_backend"):
        _map_kernel(values, dest, ATTENTION_KERNELS, default_attention)
    _map_kernel(values, "sampling_backend", SAMPLING_KERNELS, "pytorch")
    values["attention_backend"] = values.get("attention_backend") or default_attention
    for phase in ("prefill_attention_backend", "decode_attention_backend"):
        values[phase] = values.get(phase) or values["attention_backend"]
    values["sampling_backend"] = values.get("sampling_backend") or "pytorch"
    grammar = values.get("grammar_backend")
    if grammar not in (None, "none") and not _grammar_installed(grammar):
        fallback = default_grammar_backend()
        logger.warning(
            "--grammar-backend %s: its library (%s) is not installed; using %s instead.",
            grammar,
            dict(GRAMMAR_BACKEND_PREFERENCE).get(grammar, grammar),
            fallback,
        )
        values["grammar_backend"] = fallback
    values["grammar_backend"] = values.get("grammar_backend") or default_grammar_backend()


def _grammar_installed(name: str) -> bool:
    library = dict(GRAMMAR_BACKEND_PREFERENCE).get(name)
    return library is None or importlib.util.find_spec(library) is not None


# --grammar-backend when unset: the first of these whose library is installed (SGLang's default
# first; llguidance is a core dependency, so a plain `pip install` always has one). The library
# names are those of radixserve.sampling.constrained.registry, which imports torch.
GRAMMAR_BACKEND_PREFERENCE = (
    ("xgrammar", "xgrammar"),
    ("llguidance", "llguidance"),
    ("outlines", "outlines_core"),
)


def default_grammar_backend() -> str:
    for name, library in GRAMMAR_BACKEND_PREFERENCE:
        if importlib.util.find_spec(library) is not None:
            return name
    return GRAMMAR_BACKEND_PREFERENCE[0][0]  # none installed: its error names the package


def _resolve_renamed(values: dict[str, Any]) -> None:
    old = values.get("tool_call_parser")
    if old in _RENAMED_TOOL_CALL_PARSERS:
        new = _RENAMED_TOOL_CALL_PARSERS[old]
        logger.warning("--tool-call-parser %s is deprecated; use %s instead.", old, new)
        values["tool_call_parser"] = new


def _resolve_memory(values: dict[str, Any], auto: dict[str, Any]) -> None:
    device = values["device"]
    unset = values.get("chunked_prefill_size") is None or values.get("mem_fraction_static") is None
    # Reading RAM size is cheap, but CUDA's table also needs the size for the graph batch size.
    memory = hardware.device_memory_bytes(device) if unset or device == "cuda" else None
    if values.get("chunked_prefill_size") is None:
        values["chunked_prefill_size"] = default_chunked_prefill_size(device, memory)
    if values.get("mem_fraction_static") is None:
        values["mem_fraction_static"] = default_mem_fraction_static(
            device,
            memory,
            values["chunked_prefill_size"],
            values.get("tp_size", 1),
            values.get("pp_size", 1),
        )
    graph_bs = default_cuda_graph_max_bs(device, memory, values.get("torch_compile_max_bs", 32))
    auto["cuda_graph_max_bs_decode"] = graph_bs
    if values.get("cuda_graph_max_bs_decode") is None:
        values["cuda_graph_max_bs_decode"] = graph_bs


# --dtype auto for a GGUF run on K-quant blocks: the kernels quantize activations to int8
# themselves, so bfloat16 buys nothing there, and float32 is what the batch-1 layer chain runs.
# Measured on a 1B Q4_K_M (AMX Xeon, 512-token context): float32 with a bfloat16 KV cache
# 238 tok/s prefill and 43.5 ms per decode step, bfloat16 220 and 46.0. (The default Q4_1 model
# is the other way round: its bfloat16 path is ~1.8x faster at batch 1.)
KQUANT_FLOAT32_SHARE = 0.5


def _resolve_gguf_dtype(values: dict[str, Any]) -> None:
    """float32 activations (with the CPU's auto KV dtype) where most of a GGUF's block bytes
    are K-quants run on their blocks; otherwise --dtype auto resolves as for any model."""
    if values.get("quantization") != "gguf" or values.get("dtype") != "auto":
        return
    path = Path(str(values.get("model_path", "")))
    if values["device"] != "cpu" or path.suffix.lower() != ".gguf" or not path.is_file():
        return
    from radixserve.kernels.gguf_types import Q8K_TYPES, QUANTIZED_TYPES
    from radixserve.utils.gguf_cache import tensor_table

    try:
        table = tensor_table(path)
    except (OSError, ValueError):
        return  # the loader reports an unreadable file with its reason
    quantized = [t for t in table if t.tensor_type in QUANTIZED_TYPES]
    total = sum(t.n_bytes for t in quantized)
    kquant = sum(t.n_bytes for t in quantized if t.tensor_type in Q8K_TYPES)
    if total == 0 or kquant < KQUANT_FLOAT32_SHARE * total:
        return
    values["dtype"] = "float32"
    kv = ""
    if values.get("kv_cache_dtype") == "auto" and hardware.cpu_auto_dtype().dtype == "bfloat16":
        values["kv_cache_dtype"] = "bfloat16"
        kv = " with a bfloat16 KV cache"
    logger.info(
        "GGUF K-quant model (%.0f%% of its block bytes): --dtype auto runs float32 activations%s "
        "(the K-quant kernels quantize them to int8 themselves; float32 measured faster)",
        100 * kquant / total,
        kv,
    )


def resolve(values: dict[str, Any]) -> Resolution:
    """Fill every unset/"auto" value; ``values`` must hold every dest (defaults included)."""
    values = dict(values)
    auto: dict[str, Any] = {}
    _resolve_model(values)
    device = values.get("device") or hardware.detect_device()
    values["device"] = str(device).split(":")[0]  # 'cuda:0' -> 'cuda', as SGLang does
    if values.get("random_seed") is None:
        values["random_seed"] = random.randint(0, 1 << 30)
    if values.get("page_size") is None:
        values["page_size"] = 1
    if values.get("log_level_http") is None:
        values["log_level_http"] = values.get("log_level", "info")
    _resolve_gguf_quantization(values)
    _resolve_gguf_dtype(values)
    _resolve_backends(values)
    _resolve_renamed(values)
    if values["device"] in ("cpu", "cuda"):
        _resolve_memory(values, auto)
    return Resolution(values, auto)
