"""GGUF Q4_1 blocks as PyTorch's packed int4 weights (`aten._weight_int4pack_mm_for_cpu`).

A Q4_1 block holds 32 4-bit values q with an fp16 scale d and offset m: w = d * q + m. PyTorch's
CPU int4 matmul takes groups of 32 with a scale s and a zero z as w = (q - 8) * s + z, so the
file's blocks map onto it exactly with s = d and z = m + 8 d (rounded to bfloat16, the dtype it
keeps them in). Its activations are bfloat16: on CPUs with AVX512-BF16 or AMX that is what their
units multiply (issue 8 measured 3.2-3.4x at batch 1 there, compiled), elsewhere it is emulated
and slower than radixserve's own integer kernels (gguf_gemm.cpp). layers/fast_path.py times both
on the model's shapes and uses this only where it measured faster.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from radixserve.kernels import reference

Q4_1 = reference.GGML_Q4_1
BLOCK = 32
BLOCK_BYTES = reference.BLOCK_BYTES[Q4_1]


class Int4PackWeight(NamedTuple):
    """A Q4_1 weight [out_features, in_features] in PyTorch's packed int4 layout."""

    packed: torch.Tensor  # uint8, what _convert_weight_to_int4pack_for_cpu returns
    scales_zeros: torch.Tensor  # bfloat16 [in_features / 32, out_features, 2]
    out_features: int
    in_features: int


def packable(out_features: int) -> bool:
    """Whether PyTorch's int4 layout takes a weight with this many rows."""
    return out_features % 16 == 0


def pack_q4_1(blocks: torch.Tensor) -> Int4PackWeight:
    """Q4_1 blocks (uint8 [N, K/32*20], GGUF's layout) -> the packed int4 weight."""
    if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] % BLOCK_BYTES:
        raise ValueError("Q4_1 blocks must be a uint8 [rows, K / 32 * 20] tensor")
    if not packable(blocks.shape[0]):
        raise ValueError(f"the int4 layout needs a multiple of 16 rows, not {blocks.shape[0]}")
    q, d, m = reference.q4_1_codes(blocks)  # [N, nb, 32], [N, nb, 1] twice
    n = blocks.shape[0]
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
        q.reshape(n, -1).to(torch.int32).contiguous(), 1
    )
    scales_zeros = torch.cat([d, m + 8 * d], dim=-1).transpose(0, 1).contiguous()
    return Int4PackWeight(packed, scales_zeros.to(torch.bfloat16), n, q.shape[1] * BLOCK)


def int4pack_linear(
    x: torch.Tensor, weight: Int4PackWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x @ W^T (+ bias) in bfloat16 on the packed weight; returned in x's dtype."""
    flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).contiguous()
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(
        flat, weight.packed, BLOCK, weight.scales_zeros
    )
    out = out.to(x.dtype).reshape(*x.shape[:-1], weight.out_features)
    return out if bias is None else out + bias


@functools.cache
def int4pack_support() -> tuple[bool, str]:
    """(whether this PyTorch runs the packed int4 matmul here, and correctly; why not)."""
    gen = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (16, 2 * BLOCK_BYTES), dtype=torch.uint8, generator=gen)
    scales = torch.tensor([0.01, 0.002], dtype=torch.float16).view(torch.uint8)
    blocks[:, 0:4] = scales
    blocks[:, 20:24] = scales
    try:
        weight = pack_q4_1(blocks)
        x = torch.randn(3, 2 * BLOCK, generator=gen)
        got = int4pack_linear(x, weight)
    except (RuntimeError, NotImplementedError) as exc:
        return False, str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    want = x @ reference.dequantize_blocks(blocks, Q4_1, blocks.shape[0]).T
    if not torch.allclose(got, want, rtol=3e-2, atol=3e-2):
        return False, "PyTorch's int4 matmul gave wrong results in a self-check"
    return True, ""
