"""Dequantization of every GGUF block type in PyTorch: the fallback where the C++ kernels do not
run a type (or are not built), and the reference the kernels are tested against.

Each function takes blocks as uint8 [n_blocks, bytes per block] and returns float32
[n_blocks, weights per block]. The float operations are gguf-py's (llama.cpp's Python package),
in its order, so the results are bitwise equal to `gguf.quants.dequantize` (tested).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from radixserve.kernels import gguf_types as gt

_IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[n, 2] uint8 -> [n, 1] float32 (fp16 scales)."""
    return b.contiguous().view(torch.float16).to(torch.float32)


def _nibbles(qs: torch.Tensor, group: int) -> torch.Tensor:
    """[n, bytes] -> [n, bytes / group, 2 * group]: per run of `group` bytes, the low nibbles
    then the high nibbles (the layout of Q4_0..IQ4_XS and of Q4_K/Q5_K's 32-byte runs)."""
    n = qs.shape[0]
    runs = qs.reshape(n, -1, 1, group)
    return torch.cat([runs & 0x0F, runs >> 4], dim=2).reshape(n, -1, 2 * group)


def _bits(words: torch.Tensor, count: int) -> torch.Tensor:
    """[n, 4] uint8 (a little-endian uint32) -> [n, count] of its low `count` bits."""
    value = words.contiguous().view(torch.int32).to(torch.int64)
    shifts = torch.arange(count, dtype=torch.int64)
    return ((value >> shifts) & 1).to(torch.uint8)


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[:, :2])
    q = _nibbles(b[:, 2:], 16).reshape(b.shape[0], -1).to(torch.int8) - 8
    return d * q.to(torch.float32)


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    d, m = _f16(b[:, :2]), _f16(b[:, 2:4])
    q = _nibbles(b[:, 4:], 16).reshape(b.shape[0], -1).to(torch.float32)
    return d * q + m


def _q5_low_high(qh: torch.Tensor, qs: torch.Tensor) -> torch.Tensor:
    low = _nibbles(qs, 16).reshape(qs.shape[0], -1)
    return low | (_bits(qh, 32) << 4)


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[:, :2])
    q = _q5_low_high(b[:, 2:6], b[:, 6:]).to(torch.int8) - 16
    return d * q.to(torch.float32)


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    d, m = _f16(b[:, :2]), _f16(b[:, 2:4])
    q = _q5_low_high(b[:, 4:8], b[:, 8:]).to(torch.float32)
    return d * q + m


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[:, :2])
    return b[:, 2:].contiguous().view(torch.int8).to(torch.float32) * d


def _shifted(qs: torch.Tensor, run: int, shifts: tuple[int, ...], mask: int) -> torch.Tensor:
    """[n, bytes] -> [n, bytes / run * len(shifts), run]: each run of bytes read at every shift
    (the 2-bit planes of Q2_K/Q3_K/Q6_K)."""
    n = qs.shape[0]
    s = torch.tensor(shifts, dtype=torch.uint8).reshape(1, 1, -1, 1)
    return ((qs.reshape(n, -1, 1, run) >> s) & mask).reshape(n, -1, run)


def _q2_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    scales, qs, d, dmin = b[:, :16], b[:, 16:80], _f16(b[:, 80:82]), _f16(b[:, 82:84])
    dl = (d * (scales & 0xF).to(torch.float32)).reshape(n, 16, 1)
    ml = (dmin * (scales >> 4).to(torch.float32)).reshape(n, 16, 1)
    q = _shifted(qs, 32, (0, 2, 4, 6), 3).reshape(n, 16, 16).to(torch.float32)
    return (dl * q - ml).reshape(n, 256)


def q3_k_scales(scales: torch.Tensor) -> torch.Tensor:
    """Q3_K's 12 scale bytes -> [n, 16] signed 6-bit sub-block scales (as int8)."""
    n = scales.shape[0]
    low = _shifted(scales[:, :8], 8, (0, 4), 0x0F).reshape(n, 16)
    high = _shifted(scales[:, 8:12], 4, (0, 2, 4, 6), 0x03).reshape(n, 16)
    return (low | (high << 4)).to(torch.int8) - 32


def _q3_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    hmask, qs, d = b[:, :32], b[:, 32:96], _f16(b[:, 108:110])
    dl = (d * q3_k_scales(b[:, 96:108]).to(torch.float32)).reshape(n, 16, 1)
    low = _shifted(qs, 32, (0, 2, 4, 6), 3).reshape(n, 16, 16)
    high = _shifted(hmask, 32, tuple(range(8)), 1).reshape(n, 16, 16) ^ 1
    q = (low.to(torch.int8) - (high << 2).to(torch.int8)).to(torch.float32)
    return (dl * q).reshape(n, 256)


def k_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 scale bytes -> ([n, 8] 6-bit scales, [n, 8] 6-bit mins) as uint8."""
    n = scales.shape[0]
    s = scales.reshape(n, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _q45_k(b: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = k_scale_min(b[:, 4:16])
    scale = (d * sc.to(torch.float32)).reshape(n, -1, 1)
    offset = (dmin * mn.to(torch.float32)).reshape(n, -1, 1)
    return (scale * low.to(torch.float32) - offset).reshape(n, 256)


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    return _q45_k(b, _nibbles(b[:, 16:144], 32).reshape(b.shape[0], 8, 32))


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    low = _nibbles(b[:, 48:176], 32).reshape(n, 8, 32)
    high = _shifted(b[:, 16:48], 32, tuple(range(8)), 1).reshape(n, 8, 32)
    return _q45_k(b, low | (high << 4))


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    ql, qh = b[:, :128], b[:, 128:192]
    scales = b[:, 192:208].contiguous().view(torch.int8).to(torch.float32)
    d = (_f16(b[:, 208:210]) * scales).reshape(n, 16, 1)
    low = _nibbles(ql, 64).reshape(n, 8, 32)
    high = _shifted(qh, 32, (0, 2, 4, 6), 3).reshape(n, 8, 32)
    q = ((low | (high << 4)).to(torch.int8) - 32).reshape(n, 16, 16).to(torch.float32)
    return (d * q).reshape(n, 256)


def _iq4_lookup(codes: torch.Tensor) -> torch.Tensor:
    table = torch.tensor(_IQ4_VALUES, dtype=torch.float32)
    return table[codes.to(torch.int64)]


def _iq4_nl(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[:, :2])
    return d * _iq4_lookup(_nibbles(b[:, 2:], 16).reshape(b.shape[0], -1))


def iq4_xs_scales(b: torch.Tensor) -> torch.Tensor:
    """IQ4_XS blocks -> [n, 8] signed 6-bit scales of their groups of 32 (as int8)."""
    n = b.shape[0]
    high_bits = b[:, 2:4].contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    high = (high_bits >> torch.arange(0, 16, 2, dtype=torch.int32)) & 3
    low = _shifted(b[:, 4:8], 1, (0, 4), 0x0F).reshape(n, 8)
    return (low.to(torch.int32) | (high << 4)).to(torch.int8) - 32


def _iq4_xs(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    dl = (_f16(b[:, :2]) * iq4_xs_scales(b).to(torch.float32)).reshape(n, 8, 1)
    q = _iq4_lookup(_nibbles(b[:, 8:136], 16).reshape(n, 8, 32))
    return (dl * q).reshape(n, 256)


# FP4 E2M1 values doubled, as ggml tabulates them (kvalues_mxfp4); the scale is halved to match.
_MXFP4_DOUBLED = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def _mxfp4(b: torch.Tensor) -> torch.Tensor:
    """ggml's block_mxfp4: the E8M0 byte e, then 16 bytes whose low nibbles are elements 0-15
    and high nibbles 16-31 (unlike the safetensors checkpoints' pairs, layers/quantization/
    mxfp4.py). value = doubled E2M1 * 2 ** (e - 128): every product exact in float32, the
    subnormal scales of e < 2 included, so equal to gguf-py's bit for bit."""
    half_scale = torch.pow(2.0, b[:, :1].to(torch.float64) - 128).to(torch.float32)
    table = torch.tensor(_MXFP4_DOUBLED, dtype=torch.float32)
    codes = _nibbles(b[:, 1:], 16).reshape(b.shape[0], 32)
    return half_scale * table[codes.to(torch.int64)]


def _f32(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float32)


def _f16_values(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).to(torch.float32)


def _bf16_values(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.bfloat16).to(torch.float32)


_DEQUANTIZERS: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    gt.F32: _f32,
    gt.F16: _f16_values,
    gt.BF16: _bf16_values,
    gt.Q4_0: _q4_0,
    gt.Q4_1: _q4_1,
    gt.Q5_0: _q5_0,
    gt.Q5_1: _q5_1,
    gt.Q8_0: _q8_0,
    gt.Q2_K: _q2_k,
    gt.Q3_K: _q3_k,
    gt.Q4_K: _q4_k,
    gt.Q5_K: _q5_k,
    gt.Q6_K: _q6_k,
    gt.IQ4_NL: _iq4_nl,
    gt.IQ4_XS: _iq4_xs,
    gt.MXFP4: _mxfp4,
}


def dequantize(data: torch.Tensor, qtype: int, shape: tuple[int, ...]) -> torch.Tensor:
    """GGUF tensor bytes (uint8, any shape, C order) of `qtype` -> float32 tensor of `shape`."""
    fmt = gt.FORMATS.get(qtype)
    if fmt is None:
        raise ValueError(f"GGML {gt.type_name(qtype)} is not supported")
    blocks = data.reshape(-1, fmt.bytes)
    return _DEQUANTIZERS[qtype](blocks).reshape(shape)


def dequantize_rows(blocks: torch.Tensor, qtype: int, out_features: int) -> torch.Tensor:
    """A linear weight's blocks [N, row bytes] -> float32 [N, K]."""
    k = gt.row_weights(qtype, blocks.reshape(out_features, -1).shape[1])
    return dequantize(blocks, qtype, (out_features, k))
