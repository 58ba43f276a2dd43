"""Every GGUF block type: dequantization equal to gguf-py's bitwise, the C++ integer kernels
within a stated bound of a float64 matmul, and the tile-wise PyTorch fallback."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from radixserve.kernels import gguf_dequant, gguf_types, ops, reference
from radixserve.kernels.build import load_extension
from tests.helpers.tiny_gguf import random_blocks

ALL_TYPES = sorted(gguf_types.FORMATS)
QUANTIZED = sorted(gguf_types.QUANTIZED_TYPES)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=gguf_types.type_name)
def test_dequantize_equals_gguf_py_bitwise(qtype: int) -> None:
    from gguf import GGMLQuantizationType, dequantize

    fmt = gguf_types.FORMATS[qtype]
    rng = np.random.default_rng(qtype)
    # Any bytes: NaN and inf scales included, which must come out the same too.
    raw = rng.integers(0, 256, size=(3, 8 * fmt.bytes), dtype=np.uint8)
    with np.errstate(all="ignore"):
        expected = np.asarray(dequantize(raw, GGMLQuantizationType(qtype)), dtype=np.float32)
    ours = gguf_dequant.dequantize(torch.from_numpy(raw), qtype, expected.shape)
    torch.testing.assert_close(ours, torch.from_numpy(expected), rtol=0, atol=0, equal_nan=True)


def test_unknown_type_is_refused() -> None:
    with pytest.raises(ValueError, match="type 99"):
        gguf_dequant.dequantize(torch.zeros(4, dtype=torch.uint8), 99, (4,))


def test_row_bytes_checks_the_block_size() -> None:
    assert gguf_types.row_bytes(gguf_types.Q4_K, 512) == 288
    with pytest.raises(ValueError, match="multiple of 256"):
        gguf_types.row_bytes(gguf_types.Q6_K, 576)
    for qtype in QUANTIZED:  # and row_weights is its inverse
        k = 2 * gguf_types.FORMATS[qtype].weights
        assert gguf_types.row_weights(qtype, gguf_types.row_bytes(qtype, k)) == k


def _relative_error(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> float:
    expected = x.double() @ w.double().T
    return ((got.double() - expected).abs().max() / expected.abs().max()).item()


@pytest.mark.parametrize("qtype", QUANTIZED, ids=gguf_types.type_name)
@pytest.mark.parametrize("rows", [1, 3, 6, 16, 33])
def test_gguf_linear_matches_float64_reference(qtype: int, rows: int) -> None:
    """The C++ kernels (int16 activations per block of 32 for small batches, float tiles for
    larger ones) stay within 1e-4 of the float64 product relative to its largest output; the
    PyTorch fallback (float weights, no activation rounding) within 1e-5."""
    n, k = 40, 512
    blocks = random_blocks(qtype, n, k, seed=rows)
    w = gguf_dequant.dequantize_rows(blocks, qtype, n)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    got = ops.gguf_linear(x, blocks, qtype, n)
    assert got.shape == (rows, n) and got.dtype == torch.float32
    assert _relative_error(got, x, w) < (1e-4 if ops.gguf_kernel_type(qtype) else 1e-5)
    assert _relative_error(reference.gguf_linear(x, blocks, qtype, n), x, w) < 1e-5


@pytest.mark.skipif(not ops.using_cpp_kernels(), reason="C++ kernels not built here")
def test_cpp_kernels_run_every_native_type() -> None:
    for qtype in gguf_types.NATIVE_TYPES:
        assert ops.gguf_kernel_type(qtype), gguf_types.type_name(qtype)
    for qtype in gguf_types.QUANTIZED_TYPES - gguf_types.NATIVE_TYPES:
        assert not ops.gguf_kernel_type(qtype)  # e.g. Q2_K: dequantized a tile at a time


@pytest.mark.skipif(not ops.using_cpp_kernels(), reason="C++ kernels not built here")
@pytest.mark.parametrize("qtype", sorted(gguf_types.NATIVE_TYPES), ids=gguf_types.type_name)
def test_a_row_does_not_depend_on_its_batch(qtype: int) -> None:
    """On the integer kernels, batch-1 decode (column-tiled kernel) and a row among others
    (row-tiled kernel) give the same bits, so a request's output does not depend on what it is
    batched with."""
    n, k = 21, 512
    blocks = random_blocks(qtype, n, k)
    x = torch.randn(11, k, generator=torch.Generator().manual_seed(1))
    alone = torch.cat(
        [ops.gguf_linear(x[r : r + 1].contiguous(), blocks, qtype, n) for r in range(11)]
    )
    # Every row count the integer kernels serve (2..11: the paired 512-bit kernel where the CPU
    # has AVX512BW, odd counts with a padded pair, more than one tile of 8 rows).
    for rows in range(2, 12):
        assert torch.equal(alone[:rows], ops.gguf_linear(x[:rows], blocks, qtype, n)), rows


@pytest.mark.skipif(not ops.using_cpp_kernels(), reason="C++ kernels not built here")
@pytest.mark.parametrize("qtype", [gguf_types.Q4_K, gguf_types.Q6_K], ids=gguf_types.type_name)
def test_bfloat16_activations(qtype: int) -> None:
    n, k = 24, 256
    blocks = random_blocks(qtype, n, k)
    w = gguf_dequant.dequantize_rows(blocks, qtype, n)
    x = torch.randn(2, k).to(torch.bfloat16)
    got = ops.gguf_linear(x, blocks, qtype, n)
    assert got.dtype == torch.bfloat16
    assert _relative_error(got.float(), x.float(), w) < 1e-2  # bfloat16 output rounding


def test_fallback_dequantizes_a_tile_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The PyTorch fallback never expands more than GGUF_TILE_ELEMENTS weights at once, and its
    tiles give the same result as one whole product."""
    monkeypatch.setattr(reference, "GGUF_TILE_ELEMENTS", 256 * 8)
    seen: list[int] = []
    real = reference.dequantize_blocks

    def spy(blocks: torch.Tensor, qtype: int, out_features: int) -> torch.Tensor:
        seen.append(out_features)
        return real(blocks, qtype, out_features)

    monkeypatch.setattr(reference, "dequantize_blocks", spy)
    n, k = 20, 256
    blocks = random_blocks(gguf_types.Q2_K, n, k)
    x = torch.randn(3, k)
    got = reference.gguf_linear(x, blocks, gguf_types.Q2_K, n)
    assert seen == [8, 8, 4]
    w = real(blocks, gguf_types.Q2_K, n)
    torch.testing.assert_close(got, x @ w.T, rtol=1e-5, atol=1e-5)


@pytest.fixture
def kquant_int8() -> Iterator[object]:
    """K-quants on int8 (Q8_K) activations for the test, int16 again after it."""
    ext = load_extension()
    if ext is None:
        pytest.skip("C++ kernels not built here")
    ext.set_kquant_int8(True)
    yield ext
    ext.set_kquant_int8(False)


@pytest.mark.parametrize("qtype", sorted(gguf_types.Q8K_TYPES), ids=gguf_types.type_name)
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_q8k_activations_match_float64_reference(
    kquant_int8: object, qtype: int, rows: int
) -> None:
    """int8 activations per 256 (llama.cpp's Q8_K): within 2e-2 of the float64 product relative
    to its largest output (int8 rounding of every activation, ~4e-3 per value), the same bits
    for a row alone and among others, and not the int16 path's results."""
    n, k = 24, 768
    blocks = random_blocks(qtype, n, k, seed=rows)
    w = gguf_dequant.dequantize_rows(blocks, qtype, n)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    got = ops.gguf_linear(x, blocks, qtype, n)
    assert _relative_error(got, x, w) < 2e-2
    assert torch.equal(ops.gguf_linear(x[:1].contiguous(), blocks, qtype, n)[0], got[0])
    kquant_int8.set_kquant_int8(False)
    assert not torch.equal(ops.gguf_linear(x, blocks, qtype, n), got)
