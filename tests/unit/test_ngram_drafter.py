"""NGRAM behind the Drafter interface: every running request teaches the shared trie its
verified tokens, drafting or not; drafts stay within each request's room."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from radixserve.speculative.ngram_drafter import NgramDrafter


def _req(tokens: list[int]) -> Any:
    return SimpleNamespace(fill_ids=tokens, spec_state=None)


def test_drafts_follow_what_other_requests_taught_the_trie() -> None:
    drafter = NgramDrafter(max_trie_depth=4, capacity=1000, min_breadth=1, max_breadth=1)
    teacher = _req([1, 2, 3, 4, 5, 6])
    student = _req([9, 2, 3])
    # room 0: no drafts, but the teacher's tokens still enter the trie.
    trees = drafter.propose([teacher, student], [0, 3])
    assert len(trees[0]) == 0
    assert list(trees[1].tokens) == [4, 5, 6]
    assert trees[1].is_chain
    assert list(drafter.propose([student], [2])[0].tokens) == [4, 5]
    drafter.commit(student, 2, 1)  # nothing held: commit, release and reset keep the trie
    drafter.release(student)
    drafter.reset()
    assert list(drafter.propose([student], [1])[0].tokens) == [4]


def test_breadth_gives_trees() -> None:
    drafter = NgramDrafter(max_trie_depth=3, capacity=1000, min_breadth=2, max_breadth=2)
    drafter.propose([_req([1, 2, 3]), _req([1, 2, 4])], [0, 0])
    tree = drafter.propose([_req([5, 1, 2])], [4])[0]
    assert sorted(tree.token(n) for n in tree.children(0)) == [3, 4]
    assert not tree.is_chain
