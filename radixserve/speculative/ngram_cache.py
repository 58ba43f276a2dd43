"""A shared n-gram trie that proposes draft tokens for NGRAM speculative decoding.

Every request's tokens (prompt and verified output) are inserted as all their n-grams up to
``max_depth`` tokens long, so the trie answers "what followed this context before?" for any
context suffix of up to ``max_depth - 1`` tokens, across requests. A request keeps the trie
nodes of its current suffixes (its *frontier*), so appending one token costs O(max_depth).

Drafting (a chain, i.e. BFS breadth 1): take the deepest frontier node that has a child (the
longest context seen before), follow its most frequent child (ties: the most recently seen),
advance the frontier virtually by that token and repeat. Only verified tokens are ever
inserted, so rejected drafts never pollute the cache.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass(eq=False, slots=True)
class _Node:
    """About 100 bytes (most nodes are leaves, which never get a children dict)."""

    depth: int
    count: int = 0
    stamp: int = 0  # insertion clock of the last visit: recency breaks count ties
    children: dict[int, _Node] | None = None

    def best_child(self) -> tuple[int, _Node] | None:
        if not self.children:
            return None
        return max(self.children.items(), key=lambda kv: (kv[1].count, kv[1].stamp))

    def child(self, token: int) -> _Node | None:
        return self.children.get(token) if self.children else None


@dataclass(eq=False)
class Frontier:
    """One sequence's trie nodes for its suffixes of length 0 .. max_depth - 1 (root first)."""

    nodes: list[_Node]
    generation: int
    num_tokens: int = 0  # tokens of the sequence inserted so far


class NgramCache:
    """The trie; ``capacity`` bounds its node count (it is cleared, then rebuilt from live
    sequences as they come back, when full)."""

    def __init__(self, max_depth: int, capacity: int) -> None:
        if max_depth < 2:
            raise ValueError(f"max trie depth must be >= 2, got {max_depth}")
        self.max_depth = max_depth
        self.capacity = capacity
        self._reset()

    def _reset(self) -> None:
        self.root = _Node(depth=0)
        self.num_nodes = 0
        self.clock = 0
        self.generation = getattr(self, "generation", -1) + 1

    def sync(self, frontier: Frontier | None, tokens: Sequence[int]) -> Frontier:
        """Insert the tokens of a sequence not yet in the trie; returns its frontier."""
        if frontier is None or frontier.generation != self.generation:
            frontier = Frontier([self.root], self.generation)
        for token in tokens[frontier.num_tokens :]:
            self._push(frontier, token)
            frontier.num_tokens += 1
        if self.num_nodes > self.capacity:
            logger.info("n-gram cache over capacity (%d nodes): cleared", self.num_nodes)
            self._reset()
        return frontier

    def _push(self, frontier: Frontier, token: int) -> None:
        self.clock += 1
        advanced = [self.root]
        for node in frontier.nodes:  # depths 0 .. max_depth - 1, so children stay in depth
            child = node.child(token)
            if child is None:
                child = _Node(depth=node.depth + 1)
                if node.children is None:
                    node.children = {}
                node.children[token] = child
                self.num_nodes += 1
            child.count += 1
            child.stamp = self.clock
            if child.depth < self.max_depth:
                advanced.append(child)
        frontier.nodes = advanced

    def propose(self, frontier: Frontier, num_tokens: int) -> list[int]:
        """Up to ``num_tokens`` draft tokens continuing the frontier's sequence."""
        if frontier.generation != self.generation:
            return []
        nodes = frontier.nodes
        draft: list[int] = []
        while len(draft) < num_tokens:
            pick = None
            for node in reversed(nodes):  # deepest (longest context) first
                if node.depth == 0:
                    break  # a bare unigram guess is too weak to spend verify work on
                pick = node.best_child()
                if pick is not None:
                    break
            if pick is None:
                break
            token = pick[0]
            draft.append(token)
            advanced = [self.root]
            for n in nodes:
                child = n.child(token)
                if child is not None and child.depth < self.max_depth:
                    advanced.append(child)
            nodes = advanced
        return draft
