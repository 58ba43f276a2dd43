"""Splitting one forward step into micro-batches for pipeline parallelism (--pp-size).

A micro-batch is a run of consecutive requests with their tokens; every request's attention
reads only its own KV, so the micro-batches are independent forward passes. Their logits rows
(and embedding rows) are put back in the step's order by `logits_at` / `hidden_at`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixserve.distributed.pipeline_layout import micro_batches

if TYPE_CHECKING:
    from radixserve.model_executor.step_io import StepInputs


@dataclass(frozen=True)
class MicroBatch:
    step: StepInputs  # the sub-step, its token rows counted from 0
    logits_at: tuple[int, ...]  # where each of its logits rows goes in the whole step's rows
    hidden_at: tuple[int, ...]  # likewise for hidden_rows


def _rows_within(rows: tuple[int, ...] | list[int], start: int, stop: int) -> tuple[list, tuple]:
    """(rows in [start, stop) shifted to start at 0, their indices in `rows`)."""
    picked = [(i, r - start) for i, r in enumerate(rows) if start <= r < stop]
    return [r for _, r in picked], tuple(i for i, _ in picked)


def split_step(step: StepInputs, max_reqs: int | None) -> list[MicroBatch]:
    """`step` as consecutive micro-batches of at most `max_reqs` requests (None: one)."""
    offsets = [0]
    for n in step.extend_lens:
        offsets.append(offsets[-1] + n)
    out = []
    for reqs in micro_batches(len(step.extend_lens), max_reqs):
        a, b = reqs.start, reqs.stop
        start, stop = offsets[a], offsets[b]
        logits_rows, logits_at = _rows_within(step.logits_rows, start, stop)
        hidden_rows, hidden_at = _rows_within(step.hidden_rows, start, stop)
        sub = step._replace(
            input_ids=step.input_ids[start:stop],
            positions=step.positions[start:stop],
            req_pool_indices=step.req_pool_indices[a:b],
            prefix_lens=step.prefix_lens[a:b],
            extend_lens=step.extend_lens[a:b],
            out_cache_loc=step.out_cache_loc[start:stop],
            logits_rows=logits_rows,
            hidden_rows=tuple(hidden_rows),
            lora_ids=step.lora_ids[a:b] if step.lora_ids else (),
        )
        out.append(MicroBatch(sub, logits_at, hidden_at))
    return out
