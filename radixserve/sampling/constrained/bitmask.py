"""Packed vocabulary bitmasks: one bit per token id, 32 ids per int32 word (bit ``i % 32`` of
word ``i // 32``), the layout xgrammar, llguidance and outlines-core all write.

A batch fills one row per constrained request and the sampler applies the rows in place
(``mask_apply``); ``unpack_bitmask`` turns rows into a bool mask where one is wanted (tests,
``GrammarMatcher.fill_bitmask``).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

_BITS = 32
_UINT32 = 1 << 32
_INT32_SIGN = 1 << 31


def bitmask_words(vocab_size: int) -> int:
    """int32 words per row for a vocabulary of ``vocab_size`` ids."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}.")
    return (vocab_size + _BITS - 1) // _BITS


def allocate_bitmask(batch_size: int, vocab_size: int) -> torch.Tensor:
    """A zeroed (nothing allowed) CPU int32 bitmask [batch_size, words]."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}.")
    return torch.zeros(batch_size, bitmask_words(vocab_size), dtype=torch.int32)


def unpack_bitmask(packed: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Bool [..., vocab_size] from int32 [..., words]; True where the token is allowed."""
    if packed.dtype != torch.int32:
        raise ValueError(f"packed must be an int32 tensor, got {packed.dtype}.")
    if packed.shape[-1] * _BITS < vocab_size:
        raise ValueError(
            f"packed has {packed.shape[-1]} words, too few for vocab_size {vocab_size}."
        )
    shifts = torch.arange(_BITS, dtype=torch.int32, device=packed.device)
    # An arithmetic shift keeps the sign bit, but "& 1" keeps only the bit asked for.
    bits = (packed.unsqueeze(-1) >> shifts) & 1
    return bits.flatten(-2)[..., :vocab_size].bool()


def write_only(row: torch.Tensor, token_ids: Iterable[int]) -> None:
    """Make ``row`` (int32 [words]) allow exactly ``token_ids``."""
    row.zero_()
    add_tokens(row, token_ids)


def add_tokens(row: torch.Tensor, token_ids: Iterable[int]) -> None:
    """Also allow ``token_ids`` in ``row`` (int32 [words]), keeping what is already allowed."""
    for token_id in token_ids:
        word, bit = divmod(int(token_id), _BITS)
        if not 0 <= word < row.shape[0]:
            continue
        value = (int(row[word]) % _UINT32) | (1 << bit)
        # Store the unsigned 32-bit pattern as the int32 with the same bits.
        row[word] = value - _UINT32 if value >= _INT32_SIGN else value


def apply_allowed_mask(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Set the logits of disallowed tokens to -inf in place and return ``logits``.

    ``allowed`` is bool, broadcastable to ``logits`` (e.g. [batch, vocab]); it is moved to the
    logits' device if needed."""
    if allowed.dtype != torch.bool:
        raise ValueError(f"allowed must be a bool tensor, got {allowed.dtype}.")
    if allowed.device != logits.device:
        allowed = allowed.to(logits.device, non_blocking=True)
    return logits.masked_fill_(~allowed, float("-inf"))
