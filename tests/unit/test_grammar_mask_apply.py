"""The packed grammar mask applied in place gives exactly the logits the old path gave: a
[B, V] bool mask (all True on unconstrained rows, the unpacked bits on constrained ones, False
past the grammar's vocabulary) and an out-of-place masked_fill."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from radixserve.managers.grammar_manager import GrammarManager
from radixserve.sampling.constrained.bitmask import unpack_bitmask, write_only
from radixserve.sampling.constrained.mask_apply import (
    PackedVocabMask,
    apply_token_bitmask_inplace,
    sparse_kernel,
    torch_kernel,
    xgrammar_kernel,
)
from radixserve.sampling.sampler import Sampler
from radixserve.sampling.sampling_batch_info import SamplingBatchInfo
from radixserve.sampling.sampling_params import SamplingParams
from tests.unit.test_grammar_core import _Matcher

KERNELS = {"auto": None, "torch": torch_kernel, "sparse": sparse_kernel}
if xgrammar_kernel() is not None:
    KERNELS["xgrammar"] = xgrammar_kernel()


def _old_masked(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int], vocab_size: int
) -> torch.Tensor:
    """The path this replaces: a bool mask the width of the logits, then masked_fill."""
    allowed = torch.ones(logits.shape, dtype=torch.bool)
    for r in rows:
        allowed[r] = False
        allowed[r, :vocab_size] = unpack_bitmask(bitmask[r], vocab_size)
    return logits.masked_fill(~allowed, float("-inf"))


def _random_case(
    gen: torch.Generator, batch: int, vocab_size: int, width: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    logits = torch.randn(batch, width, generator=gen).to(dtype)
    words = (vocab_size + 31) // 32
    # Every bit pattern, the sign bit included; the tail bits past vocab_size are set at random
    # too (they must not matter).
    bitmask = torch.randint(-(2**31), 2**31, (batch, words), generator=gen, dtype=torch.int64)
    bitmask = bitmask.to(torch.int32)
    # Every other row allows only a few words' worth (as most JSON steps do), which the
    # automatic choice sends to the sparse kernel.
    for r in range(0, batch, 2):
        keep = torch.rand(words, generator=gen) < 0.05
        bitmask[r] = bitmask[r] * keep.to(torch.int32)
    rows = sorted(set(torch.randint(0, batch, (max(1, batch // 2),), generator=gen).tolist()))
    return logits, bitmask, rows


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("vocab_size", "width"),
    [(1, 1), (31, 31), (33, 33), (1000, 1000), (997, 1024), (49152, 49152), (49155, 49216)],
)
def test_packed_in_place_equals_the_bool_mask_path(
    kernel: str, dtype: torch.dtype, vocab_size: int, width: int
) -> None:
    gen = torch.Generator().manual_seed(vocab_size * 7 + width)
    for batch in (1, 3, 8):
        logits, bitmask, rows = _random_case(gen, batch, vocab_size, width, dtype)
        expected = _old_masked(logits, bitmask, rows, vocab_size)
        got = logits.clone()
        out = apply_token_bitmask_inplace(got, bitmask, rows, vocab_size, kernel=KERNELS[kernel])
        assert out is got and got.dtype == dtype
        assert torch.equal(got, expected), (batch, rows)
        untouched = [r for r in range(batch) if r not in rows]
        assert torch.equal(got[untouched], logits[untouched])


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_all_rows_and_extreme_masks(kernel: str) -> None:
    logits = torch.randn(3, 70)
    bitmask = torch.zeros(3, 3, dtype=torch.int32)
    bitmask[1] = -1  # everything allowed (up to vocab_size 65; 65..69 are padding)
    write_only(bitmask[2], [0, 31, 32, 64])
    got = apply_token_bitmask_inplace(
        logits.clone(), bitmask, [0, 1, 2], 65, kernel=KERNELS[kernel]
    )
    assert torch.isinf(got[0]).all()
    assert torch.equal(got[1, :65], logits[1, :65]) and torch.isinf(got[1, 65:]).all()
    assert torch.isfinite(got[2]).nonzero().flatten().tolist() == [0, 31, 32, 64]


def test_packed_vocab_mask_checks_its_shape_and_rows() -> None:
    bitmask = torch.zeros(2, 2, dtype=torch.int32)
    PackedVocabMask(bitmask, (0, 1), 40)
    with pytest.raises(ValueError, match="words"):
        PackedVocabMask(bitmask, (0,), 70)
    with pytest.raises(ValueError, match="int32"):
        PackedVocabMask(bitmask.long(), (0,), 40)
    for rows in [(), (1, 0), (0, 0), (2,), (-1,)]:
        with pytest.raises(ValueError, match="rows"):
            PackedVocabMask(bitmask, rows, 40)


# --- through the manager and the sampler -------------------------------------------------------

VOCAB = 40


def _req(grammar: _Matcher | None, params: SamplingParams, output: list[int]) -> SimpleNamespace:
    return SimpleNamespace(grammar=grammar, sampling_params=params, output_ids=output)


def test_manager_fills_only_constrained_rows() -> None:
    plain = _req(None, SamplingParams(), [])
    assert GrammarManager.grammar_mask([plain, plain], VOCAB) is None
    done = _Matcher(VOCAB)
    assert done.accept_token(5)
    mask = GrammarManager.grammar_mask(
        [
            plain,
            _req(_Matcher(VOCAB), SamplingParams(), []),
            plain,
            _req(done, SamplingParams(), [5]),
        ],
        VOCAB,
    )
    assert mask is not None and mask.rows == (1, 3) and mask.vocab_size == VOCAB
    assert unpack_bitmask(mask.bitmask[1], VOCAB).nonzero().flatten().tolist() == [5]
    assert unpack_bitmask(mask.bitmask[3], VOCAB).nonzero().flatten().tolist() == [3]
    with pytest.raises(ValueError, match="vocabulary"):
        GrammarManager.grammar_mask([_req(_Matcher(VOCAB), SamplingParams(), [])], VOCAB + 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sampler_output_is_unchanged(dtype: torch.dtype) -> None:
    """Same processed logits, tokens and logprobs as the bool mask, with penalties, logit bias,
    min_new_tokens and a seeded draw in the batch; the caller's logits stay as they were."""
    torch.manual_seed(0)
    done = _Matcher(VOCAB)
    assert done.accept_token(5)
    reqs = [
        _req(_Matcher(VOCAB), SamplingParams(temperature=0.0), []),
        _req(None, SamplingParams(temperature=0.8, sampling_seed=3, repetition_penalty=1.3), [7]),
        # The grammar allows only EOS but min_new_tokens blocks it: a dead row, which falls
        # back to the raw argmax in both paths.
        _req(done, SamplingParams(temperature=0.0, min_new_tokens=4), [5]),
        _req(
            _Matcher(VOCAB),
            SamplingParams(temperature=1.0, sampling_seed=9, logit_bias={5: -2.0, 8: 1.0}),
            [],
        ),
    ]
    logits = torch.randn(len(reqs), VOCAB).to(dtype)
    raw = logits.clone()
    packed = GrammarManager.grammar_mask(reqs, VOCAB)
    assert packed is not None
    allowed = torch.ones(len(reqs), VOCAB, dtype=torch.bool)
    for r in packed.rows:
        allowed[r] = unpack_bitmask(packed.bitmask[r], VOCAB)

    def run(**mask: object) -> tuple[torch.Tensor, object]:
        info = SamplingBatchInfo.from_requests(
            [r.sampling_params for r in reqs],
            [r.output_ids for r in reqs],
            VOCAB,
            "cpu",
            eos_token_ids=[3],
            **mask,  # type: ignore[arg-type]
        )
        return info.process_logits(logits), Sampler()(logits, info, top_logprobs_num=3)

    old_x, old = run(vocab_mask=allowed)
    new_x, new = run(grammar_mask=packed)
    assert torch.equal(logits, raw)
    assert torch.equal(old_x, new_x)
    assert torch.equal(old.next_token_ids, new.next_token_ids)
    assert torch.equal(old.logprobs, new.logprobs)
    assert torch.equal(old.top_logprobs[0], new.top_logprobs[0])  # type: ignore[index]
    assert torch.equal(old.top_logprobs[1], new.top_logprobs[1])  # type: ignore[index]
    assert new.next_token_ids[0] == 5 and new.next_token_ids[2] == logits[2].argmax()


def test_sampling_batch_info_refuses_a_mask_of_another_batch() -> None:
    mask = PackedVocabMask(torch.zeros(2, 2, dtype=torch.int32), (0,), VOCAB)
    with pytest.raises(ValueError, match="grammar_mask"):
        SamplingBatchInfo.from_requests([SamplingParams()], [[]], VOCAB, "cpu", grammar_mask=mask)


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_nothing_is_written_past_the_logits(kernel: str) -> None:
    """xgrammar's kernel writes at a clear bit just past vocab_size in the last word; for logits
    exactly vocab_size wide that is the next row, or memory past the tensor. Logits are a slice
    of a wider buffer here, so such a write would show."""
    for vocab_size in (1, 6, 31, 33, 63):
        buffer = torch.zeros(2, vocab_size + 64)
        logits = buffer[:, :vocab_size]
        bitmask = torch.full((2, (vocab_size + 31) // 32), 0x55555555, dtype=torch.int32)
        bitmask[:, -1] = 0x7FFFFFFF  # every real token of the last word allowed, bit 31 clear
        apply_token_bitmask_inplace(logits, bitmask, [0, 1], vocab_size, kernel=KERNELS[kernel])
        assert torch.isfinite(buffer[:, vocab_size:]).all(), vocab_size
        apply_token_bitmask_inplace(logits, bitmask, [1], vocab_size, kernel=KERNELS[kernel])
        assert torch.isfinite(buffer[:, vocab_size:]).all(), vocab_size
