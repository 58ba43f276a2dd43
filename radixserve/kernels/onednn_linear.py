"""bfloat16 linear weights pre-packed once for oneDNN (CPU).

Eager `F.linear` on bfloat16 CPU tensors re-packs the weight into oneDNN's blocked layout on every
call, which costs as much as the matmul at decode's few rows; torch.compile with freezing packs
the weights once instead (the 1.75x compiled bf16 step of issue 8). This does the same for the
eager model (layers/fast_path.py decides where): each linear weight is reordered once at load
(`torch.ops.mkldnn._reorder_linear_weight`, what inductor's freezing calls) and multiplied with
`torch.ops.mkldnn._linear_pointwise`. oneDNN picks its AMX / AVX512-BF16 kernels itself.

packing_support probes whether this CPU can: oneDNN refuses bfloat16 without AVX512BW/VL/DQ or
AVX-NE-CONVERT.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch


class OneDNNWeight(NamedTuple):
    """A linear weight in oneDNN's packed layout (an opaque mkldnn tensor)."""

    packed: torch.Tensor
    out_features: int
    dtype: torch.dtype


@functools.cache
def packing_support(dtype: torch.dtype) -> tuple[bool, str]:
    """(whether oneDNN packs `dtype` linear weights on this CPU, why not)."""
    if not torch.backends.mkldnn.is_available():
        return False, "this PyTorch build has no oneDNN"
    try:
        weight = torch.ones(16, 32, dtype=dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        out = torch.ops.mkldnn._linear_pointwise(
            torch.ones(2, 32, dtype=dtype), packed, None, "none", [], ""
        )
    except RuntimeError as exc:  # e.g. "bf16 path needs the cpu support avx512bw ..."
        return False, str(exc).splitlines()[0]
    if not bool((out.float() == 32.0).all()):
        return False, "oneDNN's packed matmul gave wrong results in a self-check"
    return True, ""


def pack_weight(weight: torch.Tensor) -> OneDNNWeight:
    """`weight` [out, in] reordered for oneDNN (a copy: `weight` is left as it was)."""
    if weight.dim() != 2 or weight.device.type != "cpu":
        raise ValueError("only 2-D CPU weights can be packed for oneDNN")
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)
    return OneDNNWeight(packed, weight.shape[0], weight.dtype)


def onednn_linear(x: torch.Tensor, weight: OneDNNWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ W^T (+ bias) with the packed weight; x of any leading shape, in the weight's dtype."""
    flat = x.reshape(-1, x.shape[-1])
    if flat.dtype != weight.dtype:
        flat = flat.to(weight.dtype)
    out = torch.ops.mkldnn._linear_pointwise(flat.contiguous(), weight.packed, bias, "none", [], "")
    return out.reshape(*x.shape[:-1], weight.out_features)
