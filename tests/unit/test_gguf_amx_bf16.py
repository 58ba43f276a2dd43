"""The many-row Q4_1/Q8_0 matmul on AMX-BF16 tiles for bfloat16 rows (csrc/gguf_gemm_amx.cpp):
its error against a float64 product, the arithmetic it claims (bf16-rounded weights, fp32
sums), a row's bits independent of the other rows of its call, the switch, and that float32 x
and machines without AMX keep the float32 tiles (csrc/gguf_gemm_tiled.cpp) bit for bit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from radixserve.kernels import gguf_dequant, ops
from radixserve.kernels.build import load_extension
from radixserve.kernels.reference import GGML_Q4_1, GGML_Q8_0
from tests.helpers.tiny_gguf import random_blocks

QTYPES = (GGML_Q4_1, GGML_Q8_0)
# Bound on max |error| / max |exact output| through gguf_linear. Each weight is rounded to bf16
# (8-bit mantissa: relative error <= 2^-9 ~ 2e-3) and the output is rounded to bf16 again
# (<= 2^-9 of each output); x is bf16 already and the tile sums are fp32 (~1e-7 here). The
# weights' errors are independent, so their sum grows like sqrt(K) as the output does: measured
# 2-4e-3 of the largest output on these cases (the float32 tiles, whose only rounding is the
# output's, 2-3e-3). 1e-2 leaves margin and is still far below what one misplaced weight pair
# or a lost block of K gives.
BF16_BOUND = 1e-2
# Against the float64 product of the same bf16-rounded weights, before the output's rounding:
# fp32 sums only (measured <= 4e-7), plus any weight whose float32 d * q + m (an FMA in the
# kernel, two roundings in the reference) lands on the other side of a bf16 rounding midpoint.
SAME_WEIGHTS_BOUND = 2e-5


@pytest.fixture
def ext() -> Iterator[object]:
    """The extension, with the AMX-BF16 switch back on (its default) after the test."""
    ext = load_extension()
    if ext is None or not ext.float_packed_available():  # the float tiles' condition: AVX2
        pytest.skip("the C++ GGUF tiles are not built here (they need AVX2)")
    yield ext
    ext.set_gguf_tiled_amx_enabled(True)


@pytest.fixture
def amx(ext: object) -> object:
    if not ext.gguf_tiled_amx_available():
        pytest.skip("no AMX-BF16 here (CPU, compiler or OS)")
    return ext


def _case(qtype: int, n: int, k: int, m: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    blocks = random_blocks(qtype, n, k, seed=seed)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    return x, blocks


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).abs().max() / want.abs().max()).item()


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("k", [576, 1536])
@pytest.mark.parametrize("m", [1, 5, 9, 16, 17, 33, 64, 100])
def test_amx_bf16_against_float64(amx: object, qtype: int, k: int, m: int) -> None:
    n = 40 if k == 576 else 25  # partial last panel of 16 weight rows
    x, blocks = _case(qtype, n, k, m)
    w = gguf_dequant.dequantize_rows(blocks, qtype, n)
    exact = x.double() @ w.double().T
    got = amx.gguf_linear_tiled_amx(x, blocks, qtype, n)
    assert got.dtype == torch.float32
    assert _rel_err(got.to(torch.bfloat16), exact) < BF16_BOUND
    # What the kernel claims to compute: bf16 weights (round to nearest even), fp32 sums.
    same_weights = x.double() @ w.to(torch.bfloat16).double().T
    assert _rel_err(got, same_weights) < SAME_WEIGHTS_BOUND


@pytest.mark.parametrize("qtype", QTYPES)
def test_gguf_linear_takes_amx_for_bf16_many_rows(amx: object, qtype: int) -> None:
    n, k, m = 40, 576, 64  # at or past both types' many-row thresholds (12, 32)
    x, blocks = _case(qtype, n, k, m)
    got = ops.gguf_linear(x, blocks, qtype, n)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, amx.gguf_linear_tiled_amx(x, blocks, qtype, n).to(torch.bfloat16))
    # Off: the float32 tiles as before.
    assert ops.set_gguf_amx_bf16(False) is False
    assert not amx.gguf_tiled_amx_enabled()
    off = ops.gguf_linear(x, blocks, qtype, n)
    assert torch.equal(off, amx.gguf_linear_tiled(x.float(), blocks, qtype, n).to(torch.bfloat16))
    assert ops.set_gguf_amx_bf16(True) is True


@pytest.mark.parametrize("qtype", QTYPES)
def test_amx_from_5_rows_for_both_types(amx: object, qtype: int) -> None:
    """On AMX, bfloat16 rows leave the integer kernel at 5 rows (a speculative verify, a decode
    batch of 5: the tiles' cost is the weights' dequantizing, flat up to 16 rows); below that
    both types stay on it."""
    n, k = 40, 576
    for m, on_amx in ((1, False), (4, False), (5, True), (9, True), (31, True)):
        x, blocks = _case(qtype, n, k, m)
        got = ops.gguf_linear(x, blocks, qtype, n)
        amx_out = amx.gguf_linear_tiled_amx(x, blocks, qtype, n).to(torch.bfloat16)
        amx.set_gguf_tiled_enabled(False)  # the integer kernel at every row count
        try:
            integer = ops.gguf_linear(x, blocks, qtype, n)
        finally:
            amx.set_gguf_tiled_enabled(True)
        assert torch.equal(got, amx_out if on_amx else integer), m
        assert not torch.equal(amx_out, integer)  # the two paths are told apart


@pytest.mark.parametrize("qtype", QTYPES)
def test_rows_do_not_depend_on_the_call(amx: object, qtype: int) -> None:
    """One accumulator per 16 rows, over K in order, on both layouts (up to 16 rows the weights
    are the A tiles, past 16 x is): any split of the rows (one row, a few, whole, partial and
    padded blocks; strided rows) gives each row the same bits."""
    n, k = 40, 1536
    x, blocks = _case(qtype, n, k, 100)
    whole = amx.gguf_linear_tiled_amx(x, blocks, qtype, n)
    splits = ((0, 1), (1, 7), (7, 16), (16, 40), (40, 57), (57, 100))
    parts = torch.cat(
        [amx.gguf_linear_tiled_amx(x[a:b].contiguous(), blocks, qtype, n) for a, b in splits]
    )
    assert torch.equal(whole, parts)
    wide = torch.zeros(100, k + 64, dtype=torch.bfloat16)
    wide[:, :k] = x
    assert torch.equal(amx.gguf_linear_tiled_amx(wide[:, :k], blocks, qtype, n), whole)
    assert torch.equal(amx.gguf_linear_tiled_amx(wide[3:12, :k], blocks, qtype, n), whole[3:12])


@pytest.mark.parametrize("qtype", QTYPES)
def test_float32_rows_keep_the_float_tiles(ext: object, qtype: int) -> None:
    """AMX on or off, float32 x runs the float32 tiles unchanged (bitwise)."""
    n, k, m = 40, 576, 64
    x, blocks = _case(qtype, n, k, m)
    x = x.float()
    want = ext.gguf_linear_tiled(x, blocks, qtype, n)
    for enabled in (True, False):
        ext.set_gguf_tiled_amx_enabled(enabled)
        assert torch.equal(ops.gguf_linear(x, blocks, qtype, n), want)


def test_without_amx_bf16_rows_take_the_float_tiles(ext: object) -> None:
    """Where AMX-BF16 is missing (or switched off) bfloat16 rows are converted to float32 and
    run on the float tiles, as before."""
    n, k, m = 40, 576, 33
    x, blocks = _case(GGML_Q8_0, n, k, m)
    if ext.gguf_tiled_amx_available():
        ext.set_gguf_tiled_amx_enabled(False)  # the only way to reach the fallback here
    else:
        with pytest.raises(RuntimeError, match="AMX-BF16"):
            ext.gguf_linear_tiled_amx(x, blocks, GGML_Q8_0, n)
    assert not ext.gguf_tiled_amx_enabled()
    want = ext.gguf_linear_tiled(x.float(), blocks, GGML_Q8_0, n).to(torch.bfloat16)
    assert torch.equal(ops.gguf_linear(x, blocks, GGML_Q8_0, n), want)


def test_amx_refuses_other_inputs(amx: object) -> None:
    x, blocks = _case(GGML_Q8_0, 16, 64, 16)
    with pytest.raises(RuntimeError, match="bfloat16"):
        amx.gguf_linear_tiled_amx(x.float(), blocks, GGML_Q8_0, 16)
    with pytest.raises(RuntimeError, match="Q4_1 and Q8_0"):
        amx.gguf_linear_tiled_amx(x, blocks, 12, 16)


def test_set_gguf_amx_bf16_without_the_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops, "load_extension", lambda: None)
    assert ops.set_gguf_amx_bf16(True) is False
