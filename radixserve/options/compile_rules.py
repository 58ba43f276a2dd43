"""Cross-option rules of --enable-torch-compile (model_executor/compiled_decode.py)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from radixserve.options.errors import ServerArgsError

logger = logging.getLogger(__name__)

_COMPILE = "--enable-torch-compile"

# Features whose decode steps the compiled graphs do not carry: adapters' per-request deltas,
# weights split over ranks, and int8 matmuls the tracer cannot see into. (Speculation runs:
# verify passes and a draft model's tree steps are extends and run eagerly, plain decode steps
# compiled.)
_NOT_WITH_COMPILE = (
    ("enable_lora", "--enable-lora"),
    ("lora_paths", "--lora-paths"),
)


def check_torch_compile(v: Mapping[str, Any]) -> None:
    """Raise ServerArgsError for a setting --enable-torch-compile cannot run with."""
    if not v.get("enable_torch_compile"):
        if v.get("enable_torch_compile_debug_mode"):
            raise ServerArgsError(
                "--enable-torch-compile-debug-mode", f"needs {_COMPILE} (it debugs its graphs)"
            )
        if v.get("cuda_graph_bs_decode") and v.get("device", "cpu") == "cpu":
            logger.warning(
                "--cuda-graph-bs has no effect on the CPU without %s (it lists the compiled "
                "decode batch sizes)",
                _COMPILE,
            )
        return
    if v.get("device", "cpu") != "cpu":
        raise ServerArgsError(
            _COMPILE,
            f"runs on the CPU only (got --device {v.get('device')}); radixserve has no "
            "CUDA graphs or compiled CUDA decode yet",
        )
    for dest, name in _NOT_WITH_COMPILE:
        if v.get(dest):
            raise ServerArgsError(_COMPILE, f"cannot be combined with {name} yet")
    for dest, name in (("tp_size", "--tp-size"), ("pp_size", "--pp-size")):
        if v.get(dest, 1) > 1:
            raise ServerArgsError(_COMPILE, f"runs with {name} 1 only (got {v[dest]})")
    if v.get("quantization") not in (None, "gguf", "unquant"):
        raise ServerArgsError(
            _COMPILE,
            f"cannot be combined with --quantization {v['quantization']} yet (float weights "
            "and gguf only)",
        )
    decode = v.get("decode_attention_backend") or v.get("attention_backend")
    if decode not in (None, "intel_amx"):
        raise ServerArgsError(
            _COMPILE,
            f"needs the intel_amx decode attention backend (got {decode}): its attention is "
            "the opaque op the graphs call",
        )
    bs = v.get("cuda_graph_bs_decode")
    if bs and min(bs) < 1:
        raise ServerArgsError("--cuda-graph-bs-decode", f"batch sizes must be >= 1, got {bs}")
    max_bs = v.get("torch_compile_max_bs", 32)
    if bs and min(bs) > max_bs:
        raise ServerArgsError(
            "--cuda-graph-bs-decode",
            f"no batch size is <= --torch-compile-max-bs {max_bs} (got {list(bs)}): nothing "
            "would be compiled",
        )
