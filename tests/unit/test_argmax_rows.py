"""The C++ row-wise argmax that greedy sampling takes (kernels/csrc/sampling.cpp) gives
torch.argmax(dim=-1)'s answer: the first index of the largest value, NaN counted as the largest,
for rows shorter than a vector and rows long enough for the two-pass kernel, with ties across and within lanes, with a strided batch, in
float32 and in bfloat16 (a bf16 model's greedy batch, whose logits are not copied to float32);
the dispatch falls back to torch where the extension does not take the logits."""

from __future__ import annotations

import pytest
import torch

from radixserve.kernels import ops, reference
from radixserve.kernels.build import load_extension

ext = load_extension()
needs_ext = pytest.mark.skipif(ext is None, reason="needs the C++ kernels")


def _rows() -> list[torch.Tensor]:
    torch.manual_seed(0)
    rows = [torch.randn(n) for n in (1, 7, 8, 9, 31, 32, 33, 1000, 49152)]
    tie = torch.zeros(40)
    tie[[5, 13, 21, 37]] = 3.0  # the same maximum in several lanes and the tail
    rows.append(tie)
    same_lane = torch.zeros(40)
    same_lane[[3, 11]] = 2.0  # one lane, twice: the earlier index
    rows.append(same_lane)
    rows.append(torch.full((20,), float("-inf")))
    with_nan = torch.randn(50)
    with_nan[[17, 30]] = float("nan")
    rows.append(with_nan)
    tail_nan = torch.randn(19)
    tail_nan[18] = float("nan")
    rows.append(tail_nan)
    inf = torch.randn(64)
    inf[[9, 40]] = float("inf")
    rows.append(inf)
    # Rows of 64 values or more take the two-pass kernel (four max chains, then the first
    # index holding the maximum): a maximum repeated across chains and in the tail, a NaN
    # after the maximum or only in the tail, signed zeros, infinities, all -inf.
    long_tie = torch.randn(200) - 10
    long_tie[[150, 17, 33, 199]] = 5.0
    rows.append(long_tie)
    nan_after_max = torch.randn(300)
    nan_after_max[10] = 50.0
    nan_after_max[290] = float("nan")
    rows.append(nan_after_max)
    nan_in_tail = torch.randn(70)
    nan_in_tail[68] = float("nan")
    rows.append(nan_in_tail)
    zeros = torch.full((130,), -1.0)
    zeros[[40, 90]] = torch.tensor([-0.0, 0.0])
    rows.append(zeros)
    long_inf = torch.randn(129)
    long_inf[[128, 64]] = float("inf")
    rows.append(long_inf)
    rows.append(torch.full((256,), float("-inf")))
    return rows


@needs_ext
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("row", _rows(), ids=lambda r: f"n{r.numel()}")
def test_one_row_equals_torch(row: torch.Tensor, dtype: torch.dtype) -> None:
    logits = row.unsqueeze(0).to(dtype)
    assert ext.argmax_rows(logits).tolist() == logits.argmax(dim=-1).tolist()


@needs_ext
def test_bfloat16_ties_from_rounding_keep_the_first_index() -> None:
    """Values distinct in float32 can round to one bfloat16: the first of them wins, as in
    torch (and as the float32 copy of the same bf16 logits gave)."""
    row = torch.zeros(1, 100)
    row[0, 10] = 1.0001
    row[0, 70] = 1.0002  # larger in float32, equal once rounded to bf16
    half = row.bfloat16()
    assert ext.argmax_rows(half).tolist() == [10] == half.float().argmax(dim=-1).tolist()
    assert ext.argmax_rows(row).tolist() == [70]


@needs_ext
def test_a_batch_and_a_strided_batch_equal_torch() -> None:
    torch.manual_seed(1)
    logits = torch.randn(64, 1000)
    logits[3, 500] = logits[3].max()  # a tie with the earlier maximum
    assert torch.equal(ext.argmax_rows(logits), logits.argmax(dim=-1))
    wide = torch.randn(16, 1200)
    view = wide[:, :1000]  # rows 1,200 apart
    assert torch.equal(ext.argmax_rows(view), view.argmax(dim=-1))
    half = wide.bfloat16()[:, :1000]
    assert torch.equal(ext.argmax_rows(half), half.argmax(dim=-1))


def test_dispatch_takes_float_rows_and_falls_back_otherwise() -> None:
    torch.manual_seed(2)
    logits = torch.randn(5, 300)
    assert torch.equal(ops.argmax_rows(logits), reference.argmax_rows(logits))
    half = logits.bfloat16()
    assert torch.equal(ops.argmax_rows(half), half.argmax(dim=-1))
    fp16 = logits.half()  # not a kernel dtype: torch's argmax
    assert torch.equal(ops.argmax_rows(fp16), fp16.argmax(dim=-1))
