"""Req.fill_slice / Req.last_token read fill_ids (the prompt then the output) without building
it: every span across the prompt, the output and the boundary, and an empty output."""

from __future__ import annotations

from radixserve.managers.schedule_batch import Req
from radixserve.sampling.sampling_params import SamplingParams


def test_every_span_equals_slicing_fill_ids() -> None:
    req = Req("r", [5, 6, 7, 8], SamplingParams())
    assert req.last_token == 8
    assert req.fill_slice(0, 4) == [5, 6, 7, 8] and req.fill_slice(4, 4) == []
    req.output_ids.extend([20, 21, 22])
    fill = req.fill_ids
    assert req.last_token == 22 == fill[-1]
    for start in range(len(fill) + 1):
        for end in range(start, len(fill) + 1):
            assert req.fill_slice(start, end) == fill[start:end], (start, end)
    # The slice is a copy: changing it leaves the request alone.
    req.fill_slice(2, 6).append(99)
    assert req.fill_ids == fill
