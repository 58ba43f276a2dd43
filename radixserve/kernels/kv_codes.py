"""8-bit KV cache codes (--kv-cache-dtype fp8_e4m3 / fp8_e5m2) in PyTorch.

A cache of dtype float8_e4m3fn or float8_e5m2 holds K / k_scale and V / v_scale per layer.
Storing divides and saturates at the format's largest finite value: PyTorch's conversion
turns e4m3 values past 448 into NaN (the format has no infinity) and e5m2 ones into infinity,
either of which would poison a whole softmax. The C++ kernels (csrc/common.h from_float,
csrc/attention.cpp load8) do the same arithmetic, so both paths store the same codes.
Float caches (float32, bfloat16, float16) have scale 1 and take the plain conversion.
"""

from __future__ import annotations

import torch

FP8_DTYPES: tuple[torch.dtype, ...] = (torch.float8_e4m3fn, torch.float8_e5m2)


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_DTYPES


def encode(x: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """x in the cache's dtype: for an 8-bit cache, x / scale saturated to the format's range
    (computed in float32, as the C++ store does)."""
    if not is_fp8(dtype):
        return x.to(dtype)
    limit = torch.finfo(dtype).max
    return (x.to(torch.float32) / scale).clamp_(-limit, limit).to(dtype)


def decode(codes: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """Cache values (a gathered slice) as `dtype`: 8-bit codes widened and times scale."""
    if not is_fp8(codes.dtype):
        return codes.to(dtype)
    values = codes.to(torch.float32)
    if scale != 1.0:
        values = values * scale
    return values.to(dtype)
