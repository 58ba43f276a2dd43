"""MXFP4 (OCP microscaling FP4) weights -> float, as gpt-oss checkpoints store their experts.

The format: elements in blocks of 32, each element an FP4 E2M1 code (1 sign bit, 2 exponent
bits, 1 mantissa bit: the values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives), two codes a
byte with the lower-indexed element in the low nibble; each block shares one E8M0 scale byte,
the power of two 2 ** (byte - 127). A checkpoint's `*_blocks` tensor is uint8
[..., blocks per row, 16] and its `*_scales` uint8 [..., blocks per row]; the row they decode
to is blocks per row * 32 elements long.

gpt-oss's experts are kept in that format in memory (repack_mxfp4): as ggml's block_mxfp4, the
layout GGUF files store MXFP4 in and the C++ block kernels run (kernels/csrc/gguf_kquant.cpp),
17 bytes per 32 weights: the scale byte, then 16 bytes whose low nibbles are elements 0-15 and
high nibbles elements 16-31. The E8M0 byte and the E2M1 codes are the same in both layouts;
only where each code sits in the 16 bytes differs.
"""

from __future__ import annotations

import torch

ELEMENTS_PER_BLOCK = 32
BYTES_PER_BLOCK = ELEMENTS_PER_BLOCK // 2
SCALE_BIAS = 127
# E2M1 code -> value: codes 0-7 positive, 8-15 the same magnitudes negated (sign bit 3).
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_VALUES = (*_E2M1, *(-v for v in _E2M1))


GGML_BLOCK_BYTES = 1 + BYTES_PER_BLOCK  # ggml's block_mxfp4: scale byte, 16 bytes of codes


def _check(blocks: torch.Tensor, scales: torch.Tensor) -> None:
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(
            f"MXFP4 blocks and scales must be uint8, got {blocks.dtype}, {scales.dtype}"
        )
    if blocks.shape[-1] != BYTES_PER_BLOCK or blocks.shape[:-1] != scales.shape:
        raise ValueError(
            f"MXFP4 blocks {tuple(blocks.shape)} do not match scales {tuple(scales.shape)}: "
            f"expected blocks [..., G, {BYTES_PER_BLOCK}] and scales [..., G]"
        )


def repack_mxfp4(
    blocks: torch.Tensor, scales: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """A checkpoint's blocks uint8 [..., G, 16] and scales [..., G] -> ggml block_mxfp4 rows
    uint8 [..., G * 17] holding the same values (byte shuffles only: nothing is decoded),
    written into `out` ([..., G * 17], e.g. a slice of a stack) when given.

    Checkpoint byte m holds elements 2m (low nibble) and 2m + 1 (high); ggml's byte j holds
    elements j (low) and j + 16 (high). So ggml's byte 2m takes the low nibbles of checkpoint
    bytes m and 8 + m, and byte 2m + 1 their high nibbles: whole-byte masks and shifts, no
    [..., 32] array of codes."""
    _check(blocks, scales)
    shape = (*scales.shape, GGML_BLOCK_BYTES)
    want = (*scales.shape[:-1], scales.shape[-1] * GGML_BLOCK_BYTES)
    if out is None:
        out = torch.empty(want, dtype=torch.uint8)
    if out.dtype != torch.uint8 or out.shape != want:
        raise ValueError(f"repack_mxfp4: out is {out.dtype} {tuple(out.shape)}, not uint8 {want}")
    # In numpy, on views of the same memory: its uint8 shifts and masks ran ~3x faster than
    # torch's here (gpt-oss-20b's ~10 GB of experts are repacked at every load).
    view = out.view(shape).numpy()
    src = blocks.numpy()
    first, second = src[..., :8], src[..., 8:]  # elements 0-15, 16-31
    view[..., 0] = scales.numpy()
    view[..., 1::2] = (first & 0x0F) | (second << 4)
    view[..., 2::2] = (first >> 4) | (second & 0xF0)
    return out


def dequantize_mxfp4(
    blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """blocks uint8 [..., G, 16] and scales uint8 [..., G] -> `dtype` [..., G * 32].

    Decoded in float32, where every product is exact (a 2-bit-mantissa value times a power of
    two) until the exponent leaves float32's range, then cast once. The reserved scale byte 255
    (NaN in the spec) is not special-cased: published checkpoints do not use it."""
    _check(blocks, scales)
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    low = table[(blocks & 0x0F).long()]
    high = table[(blocks >> 4).long()]
    # Element 2j is byte j's low nibble, element 2j + 1 its high one.
    values = torch.stack([low, high], dim=-1).flatten(-2)  # [..., G, 32]
    exponents = scales.to(torch.int32) - SCALE_BIAS
    values = torch.ldexp(values, exponents.unsqueeze(-1).to(torch.float32))
    return values.flatten(-2).to(dtype)
