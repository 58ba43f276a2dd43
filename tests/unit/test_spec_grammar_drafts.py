"""speculative/grammar_drafts.py: drafts of a grammar-constrained request are cut where the
grammar refuses them, and each verify row gets the mask of the state after the drafts before
it, with the matcher left exactly as it was."""

from __future__ import annotations

import torch

from radixserve.sampling.constrained.base import GrammarMatcher
from radixserve.sampling.constrained.bitmask import allocate_bitmask, unpack_bitmask, write_only
from radixserve.speculative.draft_tree import DraftTree
from radixserve.speculative.grammar_drafts import fill_tree_masks, grammar_subtree

VOCAB = 40
EOS = 3


class CountingMatcher(GrammarMatcher):
    """Allows the next integer after the last accepted token (starting at 10), or EOS from 13
    on; nothing after EOS but EOS."""

    def __init__(self) -> None:
        super().__init__(VOCAB, (EOS,))
        self.tokens: list[int] = []

    def _allowed(self) -> list[int]:
        if self.is_terminated():
            return [EOS]
        nxt = self.tokens[-1] + 1 if self.tokens else 10
        return [nxt, EOS] if nxt > 13 else [nxt]

    def fill_packed(self, bitmask: torch.Tensor, index: int = 0) -> None:
        write_only(bitmask[index], self._allowed())

    def accept_token(self, token_id: int) -> bool:
        if not self._in_vocab(token_id) or token_id not in self._allowed():
            return False
        self.tokens.append(token_id)
        self._accepted()
        return True

    def is_terminated(self) -> bool:
        return self.tokens[-1:] == [EOS]

    def _rollback(self, num_tokens: int) -> None:
        del self.tokens[-num_tokens:]


def grammar_prefix(matcher: GrammarMatcher, draft: list[int]) -> list[int]:
    """The prefix of a chain of drafts the grammar allows."""
    return list(grammar_subtree(matcher, DraftTree.chain(draft)).tokens)


def fill_verify_masks(
    matcher: GrammarMatcher, draft: list[int], bitmask: torch.Tensor, first_row: int
) -> int:
    """Rows filled for a chain of drafts (consecutive from first_row)."""
    return len(fill_tree_masks(matcher, DraftTree.chain(draft), bitmask, first_row))


def allowed_rows(bitmask: torch.Tensor, rows: range) -> list[list[int]]:
    return [unpack_bitmask(bitmask[r], VOCAB).nonzero().flatten().tolist() for r in rows]


def test_grammar_prefix_cuts_at_the_first_refused_draft() -> None:
    m = CountingMatcher()
    m.accept_token(10)
    assert grammar_prefix(m, [11, 12, 99, 13]) == [11, 12]
    assert grammar_prefix(m, [11, 12, 13, EOS, EOS]) == [11, 12, 13, EOS, EOS]
    assert grammar_prefix(m, [5]) == []
    assert grammar_prefix(m, []) == []
    assert m.tokens == [10]  # unchanged by every call
    assert m.accept_token(11)


def test_verify_masks_follow_the_drafts_and_stop_after_a_refusal() -> None:
    m = CountingMatcher()
    bitmask = allocate_bitmask(8, VOCAB)
    # All drafts allowed: one row per draft plus the bonus row.
    assert fill_verify_masks(m, [10, 11, 12], bitmask, 2) == 4
    assert allowed_rows(bitmask, range(2, 6)) == [[10], [11], [12], [13]]
    assert m.tokens == []
    # Refused at the second draft: rows up to and including that position.
    bitmask.zero_()
    assert fill_verify_masks(m, [10, 7, 8], bitmask, 0) == 2
    assert allowed_rows(bitmask, range(0, 3)) == [[10], [11], []]
    assert m.tokens == []
    # No drafts: just the row of the current state.
    m.accept_token(10)
    m.accept_token(11)
    m.accept_token(12)
    assert fill_verify_masks(m, [], bitmask, 5) == 1
    assert allowed_rows(bitmask, range(5, 6)) == [[13]]
    # Through an EOS: the row after it allows EOS only.
    assert fill_verify_masks(m, [13, EOS], bitmask, 0) == 3
    assert allowed_rows(bitmask, range(0, 3)) == [[13], [EOS, 14], [EOS]]
    assert m.tokens == [10, 11, 12]


def test_draft_trees_are_pruned_and_masked_per_path() -> None:
    """Root -> (1: 10, 2: 7); 1 -> (3: 11, 4: 12); 3 -> 5: 12; 2 -> 6: 8. The grammar allows
    10 11 12 ... only: nodes 2, 4 and 6 are refused (6 under a refused node)."""
    tree = DraftTree(tokens=(10, 7, 11, 12, 12, 8), parents=(0, 0, 1, 1, 3, 2))
    m = CountingMatcher()
    assert grammar_subtree(m, tree) == DraftTree(tokens=(10, 11, 12), parents=(0, 1, 2))
    assert m.tokens == []
    bitmask = allocate_bitmask(10, VOCAB)
    # Rows of reachable nodes hold the state after their path; refused subtrees stay unfilled.
    assert sorted(fill_tree_masks(m, tree, bitmask, 3)) == [0, 1, 3, 5]
    rows = allowed_rows(bitmask, range(3, 10))
    assert rows == [[10], [11], [], [12], [], [13], []]
    assert m.tokens == []
