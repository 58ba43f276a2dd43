"""One line saying which kernels run on this machine and why (for the startup log)."""

from __future__ import annotations

from types import ModuleType

from radixserve.kernels.build import DISABLE_ENV, load_extension
from radixserve.kernels.cpu_features import cpu_features


def kernel_summary(fast: bool) -> str:
    """What runs, in a few words: the option's value is SGLang's name (intel_amx) on every CPU,
    so the banner and /get_server_info say which instructions the kernels actually use."""
    if not fast:
        return "reference PyTorch ops"
    ext = load_extension()
    if ext is None:
        return "PyTorch fallbacks of the C++ kernels"
    isas = list(ext.q8k_isas())  # the int8 variants this build runs here, widest last
    vectors = [isa for isa in isas if isa != "amx_int8"]
    vector = vectors[-1] if vectors else "no AVX2"
    tiles = "AMX tiles" if "amx_int8" in isas else "no AMX"
    return f"radixserve C++ kernels: {vector}, {tiles}, Q4_1/Q8_0 GEMM {_legacy_gemm(ext)}"


def _legacy_gemm(ext: ModuleType) -> str:
    """Which kernel multiplies many rows by Q4_1/Q8_0 weights: bfloat16 rows on AMX-BF16 tiles,
    float32 tiles, or (--enable-deterministic-inference) the integer kernel at every row count."""
    if not ext.gguf_tiled_enabled():
        return "int16 rows"
    return "amx_bf16" if ext.gguf_tiled_amx_enabled() else "fp32 tiles"


def describe_kernels(fast: bool) -> str:
    cpu = cpu_features().summary
    if not fast:
        return f"reference PyTorch ops, exact float32; CPU {cpu}"
    if load_extension() is not None:
        return f"C++ kernels built for this CPU and self-tested; CPU {cpu}"
    return (
        f"PyTorch fallbacks of the fused kernels (C++ build unavailable or {DISABLE_ENV}=1); "
        f"CPU {cpu}"
    )
