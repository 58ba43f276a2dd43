"""Greedy sampling's LM head on GGUF blocks (ops.gguf_linear_argmax): each row's argmax over
the first `columns` outputs of gguf_linear. Where gguf_linear takes the AMX-BF16 tiles the C++
kernel keeps the argmax while the tiles are written (csrc/row_argmax.h) and never writes the
logits; it must give exactly argmax_rows of the logits gguf_linear writes: on every row count
of both tile layouts, with ties across lanes, panels and threads (the first column wins), a NaN
column (the first NaN wins), a vocabulary shorter than the head, and on the fallback paths."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from radixserve.kernels import ops, reference
from radixserve.kernels.build import load_extension
from radixserve.kernels.reference import GGML_Q4_1, GGML_Q8_0
from tests.helpers.tiny_gguf import random_blocks

QTYPES = (GGML_Q4_1, GGML_Q8_0)
K = 64


@pytest.fixture
def ext() -> Iterator[object]:
    ext = load_extension()
    if ext is None:
        pytest.skip("needs the C++ kernels")
    yield ext
    ext.set_gguf_tiled_amx_enabled(True)


def _unfused(
    ext: object, x: torch.Tensor, blocks: torch.Tensor, qtype: int, n: int, columns: int
) -> torch.Tensor:
    return ext.argmax_rows(ext.gguf_linear(x, blocks, qtype, n)[:, :columns])


def _x(m: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(m, K, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("m", [1, 4, 5, 9, 16, 17, 33, 64, 100])
def test_fused_equals_argmax_of_the_written_logits(ext: object, qtype: int, m: int) -> None:
    """Both AMX layouts (up to 16 rows, and more) and below 5 rows (no tiles); a head of 1,000
    outputs (a partial last panel) and a vocabulary of 990 of them."""
    n = 1000
    blocks = random_blocks(qtype, n, K, seed=m)
    x = _x(m, seed=m)
    for columns in (n, 990):
        got = ops.gguf_linear_argmax(x, blocks, qtype, n, columns)
        assert got.dtype == torch.int64 and got.shape == (m,)
        assert torch.equal(got, _unfused(ext, x, blocks, qtype, n, columns))
        assert int(got.max()) < columns


@pytest.mark.parametrize("qtype", QTYPES)
def test_ties_keep_the_first_column(ext: object, qtype: int) -> None:
    """A weight row copied to later columns (in other lanes, panels and, at 600 columns, the
    other thread's half) gives the same logit: the first copy is the argmax. A zero x row makes
    every logit 0.0: column 0."""
    n, m = 600, 24
    blocks = random_blocks(qtype, n, K, seed=3).clone()
    big = blocks[77].clone()
    for col in (20, 77, 78, 93, 300, 599):
        blocks[col] = big
    x = _x(m, seed=4)
    x[5] = 0
    want = _unfused(ext, x, blocks, qtype, n, n)
    got = ops.gguf_linear_argmax(x, blocks, qtype, n, n)
    assert torch.equal(got, want)
    assert int(got[5]) == 0
    # Every row whose argmax is one of the copies names the first copy, column 20.
    copies = {20, 77, 78, 93, 300, 599}
    assert all(int(c) == 20 for c in got if int(c) in copies)


def test_a_nan_column_is_the_answer(ext: object) -> None:
    """A NaN scale makes one column NaN in every row: torch's argmax (and argmax_rows) return the
    first NaN, wherever the largest finite logit is."""
    n, m = 300, 20
    blocks = random_blocks(GGML_Q8_0, n, K, seed=5).clone()
    for col in (250, 180):
        blocks[col, :2] = torch.tensor([0x00, 0x7E], dtype=torch.uint8)  # fp16 NaN scale
    x = _x(m, seed=6)
    got = ops.gguf_linear_argmax(x, blocks, GGML_Q8_0, n, n)
    assert got.tolist() == [180] * m == _unfused(ext, x, blocks, GGML_Q8_0, n, n).tolist()
    # Past `columns` the NaN is not a logit.
    assert torch.equal(
        ops.gguf_linear_argmax(x, blocks, GGML_Q8_0, n, 150),
        _unfused(ext, x, blocks, GGML_Q8_0, n, 150),
    )


@pytest.mark.parametrize("qtype", QTYPES)
def test_fallbacks_equal_the_unfused_answer(ext: object, qtype: int) -> None:
    """AMX switched off, float32 rows, and the PyTorch reference (no extension): the logits are
    made, then reduced."""
    n, m = 500, 12
    blocks = random_blocks(qtype, n, K, seed=7)
    x = _x(m, seed=8)
    ext.set_gguf_tiled_amx_enabled(False)
    assert torch.equal(
        ops.gguf_linear_argmax(x, blocks, qtype, n, n), _unfused(ext, x, blocks, qtype, n, n)
    )
    ext.set_gguf_tiled_amx_enabled(True)
    xf = x.float()
    assert torch.equal(
        ops.gguf_linear_argmax(xf, blocks, qtype, n, 400), _unfused(ext, xf, blocks, qtype, n, 400)
    )
    ref = reference.gguf_linear_argmax(xf, blocks, qtype, n, 400)
    assert torch.equal(ref, reference.gguf_linear(xf, blocks, qtype, n)[:, :400].argmax(dim=-1))


def test_refuses_a_vocabulary_larger_than_the_head(ext: object) -> None:
    blocks = random_blocks(GGML_Q8_0, 40, K, seed=9)
    with pytest.raises(RuntimeError, match="columns"):
        ext.gguf_linear_argmax(_x(8), blocks, GGML_Q8_0, 40, 41)
