from __future__ import annotations

import pytest
import torch

from radixserve.sampling import penalties
from radixserve.sampling.sampling_batch_info import SamplingBatchInfo
from radixserve.sampling.sampling_params import SamplingParams


def _process(params: list[SamplingParams], outputs: list[list[int]], logits: torch.Tensor):
    info = SamplingBatchInfo.from_requests(params, outputs, logits.shape[1], "cpu")
    return info, info.process_logits(logits)


def test_token_counts() -> None:
    counts = penalties.token_counts([[1, 1, 3], [], [0]], 4, "cpu")
    assert counts.tolist() == [[0, 2, 0, 1], [0, 0, 0, 0], [1, 0, 0, 0]]


def test_token_counts_rejects_out_of_vocab() -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        penalties.token_counts([[4]], 4, "cpu")


def test_frequency_penalty_exact() -> None:
    _, out = _process([SamplingParams(frequency_penalty=0.5)], [[1, 1, 2]], torch.zeros(1, 5))
    assert out.tolist() == [[0.0, -1.0, -0.5, 0.0, 0.0]]


def test_presence_penalty_exact() -> None:
    _, out = _process([SamplingParams(presence_penalty=0.25)], [[1, 1, 2]], torch.zeros(1, 5))
    assert out.tolist() == [[0.0, -0.25, -0.25, 0.0, 0.0]]


def test_negative_penalties_encourage() -> None:
    p = SamplingParams(frequency_penalty=-1.0, presence_penalty=-0.5)
    _, out = _process([p], [[3, 3]], torch.zeros(1, 4))
    assert out.tolist() == [[0.0, 0.0, 0.0, 2.5]]


def test_repetition_penalty_divides_positive_multiplies_negative() -> None:
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0, 1.0]])
    _, out = _process([SamplingParams(repetition_penalty=2.0)], [[0, 1, 1]], logits)
    # Applied once per seen token, whatever the count.
    assert out.tolist() == [[1.0, -4.0, 2.0, -2.0, 1.0]]


def test_order_repetition_then_additive_then_bias() -> None:
    p = SamplingParams(
        repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.1, logit_bias={2: 1.0}
    )
    _, out = _process([p], [[0, 0, 1]], torch.tensor([[2.0, -1.0, 0.5]]))
    assert torch.allclose(out, torch.tensor([[-0.1, -2.6, 1.5]]))


def test_rows_without_penalties_are_untouched() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    params = [SamplingParams(frequency_penalty=1.0, repetition_penalty=1.5), SamplingParams()]
    _, out = _process(params, [[2], [2]], logits)
    assert out[1].tolist() == [1.0, 2.0, 3.0]
    assert out[0].tolist() == [1.0, 2.0, 3.0 / 1.5 - 1.0]


def test_no_penalty_tensors_when_unused() -> None:
    info, out = _process([SamplingParams()], [[0, 1]], torch.ones(1, 3))
    assert info.token_counts is None and info.logit_bias is None
    assert not info.needs_logit_processing
    assert out.tolist() == [[1.0, 1.0, 1.0]]


def test_process_logits_does_not_modify_input() -> None:
    logits = torch.zeros(1, 3)
    _process([SamplingParams(presence_penalty=1.0, logit_bias={0: 5.0})], [[1]], logits)
    assert logits.tolist() == [[0.0, 0.0, 0.0]]


def test_min_new_tokens_block_skips_out_of_vocab_ids() -> None:
    mask = penalties.min_new_tokens_block([1], [[0, 2, 99]], 2, 3, "cpu")
    assert mask is not None
    assert mask.tolist() == [[False, False, False], [True, False, True]]
    assert penalties.min_new_tokens_block([0], [[99]], 1, 3, "cpu") is None


def test_min_new_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    p = SamplingParams(min_new_tokens=2, stop_token_ids={3})
    logits = torch.zeros(1, 5)
    for generated, blocked in (([], True), ([4], True), ([4, 4], False)):
        info = SamplingBatchInfo.from_requests([p], [generated], 5, "cpu", eos_token_ids=[0])
        out = info.process_logits(logits)[0]
        assert bool(torch.isinf(out[0])) is blocked
        assert bool(torch.isinf(out[3])) is blocked
        assert torch.isfinite(out[[1, 2, 4]]).all()
