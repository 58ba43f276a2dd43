"""sampling/output_counts.py: incremental output-token counts equal counts rebuilt from all
output ids, step after step, and a sampler fed them gives the same penalised logits."""

from __future__ import annotations

import random

import pytest
import torch

from radixserve.sampling import penalties
from radixserve.sampling.output_counts import OutputTokenCounts, batch_token_counts
from radixserve.sampling.sampling_batch_info import SamplingBatchInfo
from radixserve.sampling.sampling_params import SamplingParams

VOCAB = 300


def test_incremental_counts_equal_a_recount_every_step() -> None:
    rng = random.Random(0)
    outputs: list[list[int]] = [[], [5, 5, 7], []]
    trackers = [OutputTokenCounts(VOCAB), None, OutputTokenCounts(VOCAB)]
    for _ in range(40):
        for out in outputs:
            out.extend(rng.randrange(VOCAB) for _ in range(rng.choice((1, 1, 3))))
        got = batch_token_counts(trackers, outputs, VOCAB, "cpu")
        want = penalties.token_counts(outputs, VOCAB, "cpu")
        assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
        assert not bool(got[1].any())  # no tracker: a request without penalties
    shorter = outputs[0][:10]  # never happens in the scheduler; recounted if it did
    assert torch.equal(
        trackers[0].update(shorter), penalties.token_counts([shorter], VOCAB, "cpu")[0]
    )
    with pytest.raises(ValueError, match="outside the vocabulary"):
        OutputTokenCounts(VOCAB).update([VOCAB])


def test_sampling_info_with_given_counts_processes_logits_the_same() -> None:
    params = [
        SamplingParams(repetition_penalty=1.3),
        SamplingParams(frequency_penalty=0.5, presence_penalty=0.25),
    ]
    outputs = [[1, 2, 2, 9], [4, 4, 4, 8]]
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(0))
    rebuilt = SamplingBatchInfo.from_requests(params, outputs, VOCAB, "cpu")
    trackers = [OutputTokenCounts(VOCAB), OutputTokenCounts(VOCAB)]
    given = SamplingBatchInfo.from_requests(
        params,
        outputs,
        VOCAB,
        "cpu",
        token_counts=batch_token_counts(trackers, outputs, VOCAB, "cpu"),
    )
    assert torch.equal(rebuilt.process_logits(logits), given.process_logits(logits))
    with pytest.raises(ValueError, match="token_counts has shape"):
        SamplingBatchInfo.from_requests(
            params, outputs, VOCAB, "cpu", token_counts=torch.zeros(1, VOCAB)
        )
