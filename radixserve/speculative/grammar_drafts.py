"""Drafts for grammar-constrained requests.

A constrained request samples from its logits masked by the grammar's allowed tokens. To verify
drafts d_1..d_k exactly, verify row j must be masked by the grammar's state after d_1..d_j, the
state plain decoding would be in had it emitted those tokens. The matcher is advanced through
the drafts to fill each row's mask and then rolled back, so the scheduler's per-token
`accept_token` (scheduler._apply_spec) still sees only the tokens actually kept.

A draft the grammar refuses can never be accepted (its masked probability is zero), so the rows
after it are never read: masks are filled up to and including the refusing position.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from radixserve.sampling.constrained.base import GrammarMatcher


def grammar_prefix(matcher: GrammarMatcher, draft: Sequence[int]) -> list[int]:
    """The longest prefix of `draft` the grammar allows from the matcher's state (which is left
    as it was). N-gram drafts are cut there: verifying later positions would be wasted work."""
    kept = 0
    for token in draft:
        if not matcher.accept_token(token):
            break
        kept += 1
    matcher.rollback(kept)
    return list(draft[:kept])


def fill_verify_masks(
    matcher: GrammarMatcher, draft: Sequence[int], bitmask: torch.Tensor, first_row: int
) -> int:
    """Fill rows first_row, first_row + 1, ... of a packed bitmask with the tokens allowed at
    each verify position of `draft` (row j: after d_1..d_j); stops after the first position whose
    draft the grammar refuses. Returns the number of rows filled; the matcher is unchanged."""
    accepted = 0
    for j in range(len(draft) + 1):
        matcher.fill_packed(bitmask, first_row + j)
        if j == len(draft) or not matcher.accept_token(draft[j]):
            break
        accepted += 1
    matcher.rollback(accepted)
    return accepted + 1
