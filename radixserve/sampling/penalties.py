"""Batched logit penalties over the tokens each request has generated so far.

Definitions (SGLang's, which are OpenAI's for the additive two):

* frequency: ``logit -= frequency_penalty * count(token in output)``
* presence:  ``logit -= presence_penalty * (count(token in output) > 0)``
* repetition (multiplicative, CTRL-style): for every token already in the output,
  ``logit / p`` when the logit is positive, ``logit * p`` otherwise.

Like current SGLang, all three look at generated tokens only, never at the prompt.
Repetition is applied first, then the additive penalties (the order vLLM and HF use; SGLang
iterates over a set of penalizers, so its order is unspecified).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

logger = logging.getLogger(__name__)


def token_counts(
    output_ids: Sequence[Sequence[int]], vocab_size: int, device: torch.device | str
) -> torch.Tensor:
    """Return ``[B, V]`` float32 counts of each token in each row's output ids.

    Built with one scatter over the flattened ids (no per-token Python work beyond
    flattening the lists the scheduler already holds).
    """
    batch = len(output_ids)
    counts = torch.zeros((batch, vocab_size), dtype=torch.float32, device=device)
    lengths = [len(ids) for ids in output_ids]
    total = sum(lengths)
    if total == 0:
        return counts
    flat = torch.tensor([t for ids in output_ids for t in ids], dtype=torch.int64)
    low, high = int(flat.min()), int(flat.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(
            f"output_ids contain token id {bad}, outside the vocabulary [0, {vocab_size})."
        )
    rows = torch.repeat_interleave(
        torch.arange(batch, dtype=torch.int64), torch.tensor(lengths, dtype=torch.int64)
    )
    counts.index_put_(
        (rows.to(device), flat.to(device)),
        torch.ones(total, dtype=torch.float32, device=device),
        accumulate=True,
    )
    return counts


def apply_repetition_penalty(
    logits: torch.Tensor, counts: torch.Tensor, penalties: torch.Tensor
) -> torch.Tensor:
    """Scale logits of already-generated tokens; ``penalties`` is ``[B, 1]`` (1.0 = off)."""
    seen = counts > 0
    scaled = torch.where(logits > 0, logits / penalties, logits * penalties)
    return torch.where(seen, scaled, logits)


def apply_additive_penalties(
    logits: torch.Tensor,
    counts: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
) -> torch.Tensor:
    """Subtract frequency and presence penalties; both coefficient tensors are ``[B, 1]``."""
    return logits - frequency * counts - presence * (counts > 0).to(logits.dtype)


def min_new_tokens_block(
    blocked_rows: Sequence[int],
    blocked_ids: Sequence[Sequence[int]],
    batch: int,
    vocab_size: int,
    device: torch.device | str,
) -> torch.Tensor | None:
    """Return a ``[B, V]`` bool mask, True where a token must not be sampled this step.

    ``blocked_rows[j]`` is a row that has not yet reached its ``min_new_tokens``;
    ``blocked_ids[j]`` are its EOS and stop token ids. Ids outside the vocabulary are skipped
    because SGLang accepts stop_token_ids without checking them against the vocabulary.
    """
    rows: list[int] = []
    cols: list[int] = []
    for row, ids in zip(blocked_rows, blocked_ids, strict=True):
        for token in ids:
            if 0 <= token < vocab_size:
                rows.append(row)
                cols.append(token)
    if not rows:
        return None
    mask = torch.zeros((batch, vocab_size), dtype=torch.bool, device=device)
    mask[torch.tensor(rows, device=device), torch.tensor(cols, device=device)] = True
    return mask
