"""Float weights -> GGUF blocks, for quantizing a float checkpoint while it loads
(--quantization w8a8_int8 and bitsandbytes, layers/quantization/on_load.py). The blocks are
the formats the integer kernels already run (kernels/gguf_types.py NATIVE_TYPES), laid out
exactly as llama.cpp writes them, so kernels/gguf_dequant.py reads them back.

The scales are rounded to fp16 first and the codes computed from the rounded scales, so the
only error left is the rounding of each weight to its code (half a step) where the scales
cover the block's range; Q4_K rounds its 6-bit scales and mins up so that they always do.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from radixserve.kernels import gguf_types as gt

QK = 32  # weights per block (Q8_0, Q4_1) and per Q4_K sub-block
QK_K = 256  # weights per Q4_K super-block


def _rows_of_blocks(weight: torch.Tensor, block: int) -> torch.Tensor:
    rows, cols = weight.shape
    if cols % block:
        raise ValueError(
            f"{block}-weight blocks need a multiple of {block} input features, got {cols}"
        )
    return weight.detach().float().reshape(rows, cols // block, block)


def _fp16_bytes(values: torch.Tensor) -> torch.Tensor:
    """float32 [...] already fp16-exact -> uint8 [..., 2]."""
    return values.to(torch.float16).view(torch.uint8).reshape(*values.shape, 2)


def _fp16_at_least(values: torch.Tensor) -> torch.Tensor:
    """The smallest fp16 value >= each (non-negative, finite) value, as float32: a scale rounded
    up never shrinks the range it must cover."""
    half = values.to(torch.float16)
    low = half.float() < values
    bumped = (half.view(torch.int16) + 1).view(torch.float16)  # next fp16 up (positive values)
    return torch.where(low, bumped, half).float()


# Rows quantized at a time by in_row_chunks: bounds the float32 temporaries (a few copies of
# the chunk) whatever the layer's size.
CHUNK_WEIGHTS = 1 << 20


def in_row_chunks(
    quantize: Callable[[torch.Tensor], torch.Tensor], weight: torch.Tensor
) -> torch.Tensor:
    """quantize(weight), made CHUNK_WEIGHTS weights of rows at a time into one output (every
    format here quantizes rows independently, so the bytes are the same)."""
    rows, cols = weight.shape
    step = max(1, CHUNK_WEIGHTS // max(cols, 1))
    if step >= rows:
        return quantize(weight)
    first = quantize(weight[:step])
    out = torch.empty(rows, first.shape[1], dtype=torch.uint8)
    out[:step] = first
    for start in range(step, rows, step):
        out[start : start + step] = quantize(weight[start : start + step])
    return out


def q8_0_blocks(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] float weight (K a multiple of 32) -> [N, K / 32 * 34] uint8 Q8_0 blocks: one fp16
    scale (block max / 127) and 32 int8 codes per block."""
    w = _rows_of_blocks(weight, QK)
    rows, blocks = w.shape[:2]
    scale = w.abs().amax(dim=-1) / 127.0
    inverse = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    q = torch.round(w * inverse.unsqueeze(-1)).clamp_(-127, 127).to(torch.int8)
    d = scale.to(torch.float16).view(torch.uint8).reshape(rows, blocks, 2)
    out = torch.cat([d, q.view(torch.uint8)], dim=-1)
    assert out.shape[-1] == gt.FORMATS[gt.Q8_0].bytes
    return out.reshape(rows, -1).contiguous()


def q4_1_blocks(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] float weight (K a multiple of 32) -> [N, K / 32 * 20] uint8 Q4_1 blocks: fp16 step
    d and minimum m, 16 bytes of 4-bit codes (weights 0-15 in the low nibbles, 16-31 in the high
    ones); w = d * q + m."""
    w = _rows_of_blocks(weight, QK)
    rows = w.shape[0]
    low = w.amin(dim=-1)
    m = low.to(torch.float16).float()
    d = _fp16_at_least((w.amax(dim=-1) - m).clamp_(min=0) / 15.0)
    inverse = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round((w - m.unsqueeze(-1)) * inverse.unsqueeze(-1)).clamp_(0, 15).to(torch.uint8)
    packed = q[..., :16] | (q[..., 16:] << 4)
    out = torch.cat([_fp16_bytes(d), _fp16_bytes(m), packed], dim=-1)
    assert out.shape[-1] == gt.FORMATS[gt.Q4_1].bytes
    return out.reshape(rows, -1).contiguous()


def q4_k_blocks(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] float weight (K a multiple of 256) -> [N, K / 256 * 144] uint8 Q4_K blocks.

    A super-block of 256 weights has fp16 d and dmin and eight sub-blocks of 32, each with a
    6-bit scale s and min m: w = d * s * q - dmin * m, q in 0..15. Here each sub-block's range
    [min(w, 0), max(w)] is covered exactly: m is rounded up (the offset reaches the minimum),
    then s is rounded up for the range above that offset, so a code is off by at most half of
    its sub-block's step d * s. (llama.cpp searches scales that minimise the squared error
    instead; min-max is simpler and bounded.)"""
    w = _rows_of_blocks(weight, QK_K).reshape(weight.shape[0], -1, 8, QK)
    rows, supers = w.shape[:2]
    # Mins are stored as a positive offset below zero: a sub-block above zero starts at zero.
    offset = (-w.amin(dim=-1)).clamp_(min=0)  # [N, S, 8]
    dmin = _fp16_at_least(offset.amax(dim=-1) / 63.0)  # [N, S]
    inv_dmin = torch.where(dmin > 0, 1.0 / dmin, torch.zeros_like(dmin)).unsqueeze(-1)
    m_q = torch.ceil(offset * inv_dmin).clamp_(0, 63)
    base = -(dmin.unsqueeze(-1) * m_q)  # <= each sub-block's minimum
    step_needed = (w.amax(dim=-1) - base).clamp_(min=0) / 15.0
    d = _fp16_at_least(step_needed.amax(dim=-1) / 63.0)
    inv_d = torch.where(d > 0, 1.0 / d, torch.zeros_like(d)).unsqueeze(-1)
    s_q = torch.ceil(step_needed * inv_d).clamp_(0, 63)
    step = d.unsqueeze(-1) * s_q  # as the kernels compute it: float32 d * s
    inv_step = torch.where(step > 0, 1.0 / step, torch.zeros_like(step))
    q = torch.round((w - base.unsqueeze(-1)) * inv_step.unsqueeze(-1)).clamp_(0, 15)
    q = q.to(torch.uint8).reshape(rows, supers, 4, 2, QK)  # 4 pairs of sub-blocks
    qs = (q[:, :, :, 0] | (q[:, :, :, 1] << 4)).reshape(rows, supers, 128)
    sc, mn = s_q.to(torch.uint8), m_q.to(torch.uint8)
    # 12 scale bytes (llama.cpp's get_scale_min_k4 read backwards): bytes 0-3 the low six bits
    # of scales 0-3 with the top two bits of scales 4-7 above them, bytes 4-7 the same for the
    # mins, bytes 8-11 the low four bits of scales and mins 4-7.
    scales = torch.cat(
        [
            sc[..., :4] | ((sc[..., 4:] >> 4) << 6),
            mn[..., :4] | ((mn[..., 4:] >> 4) << 6),
            (sc[..., 4:] & 0x0F) | ((mn[..., 4:] & 0x0F) << 4),
        ],
        dim=-1,
    )
    out = torch.cat([_fp16_bytes(d), _fp16_bytes(dmin), scales, qs], dim=-1)
    assert out.shape[-1] == gt.FORMATS[gt.Q4_K].bytes
    return out.reshape(rows, -1).contiguous()
