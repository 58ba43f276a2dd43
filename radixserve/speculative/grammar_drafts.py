"""Drafts for grammar-constrained requests.

A constrained request samples from its logits masked by the grammar's allowed tokens. To verify
a draft tree exactly, node n's row must be masked by the grammar's state after the drafts on n's
path, the state plain decoding would be in had it emitted those tokens. The matcher walks the
tree depth first (accept a child's token, fill, recurse, roll back one token), so the
scheduler's per-token `accept_token` (OutputProcessor.apply_tokens) still sees only the tokens
actually kept.

A draft the grammar refuses can never be accepted (its masked probability is zero), so the rows
below it are never read: they are left unfilled, and n-gram drafts are pruned there first.
"""

from __future__ import annotations

import torch

from radixserve.sampling.constrained.base import GrammarMatcher
from radixserve.speculative.draft_tree import DraftTree


def grammar_subtree(matcher: GrammarMatcher, tree: DraftTree) -> DraftTree:
    """The draft nodes whose whole path the grammar allows from the matcher's state (which is
    left as it was). Drafts are pruned there: verifying the rest would be wasted work."""
    kept: list[int] = []

    def visit(node: int) -> None:
        for child in tree.children(node):
            if matcher.accept_token(tree.token(child)):
                kept.append(child)
                visit(child)
                matcher.rollback(1)

    visit(0)
    return tree.subtree(kept)


def fill_tree_masks(
    matcher: GrammarMatcher, tree: DraftTree, bitmask: torch.Tensor, first_row: int
) -> list[int]:
    """Fill row first_row + n of a packed bitmask with the tokens allowed at node n (after the
    drafts on n's path), for every node the grammar can reach; returns those nodes. A node
    whose token the grammar refuses is never accepted (its parent's row masks it out), so its
    subtree's rows are never read and stay unfilled. The matcher is left unchanged."""
    filled: list[int] = []

    def visit(node: int) -> None:
        matcher.fill_packed(bitmask, first_row + node)
        filled.append(node)
        for child in tree.children(node):
            if matcher.accept_token(tree.token(child)):
                visit(child)
                matcher.rollback(1)

    visit(0)
    return filled
