"""A shared n-gram trie that proposes draft tokens for NGRAM speculative decoding.

Every request's tokens (prompt and verified output) are inserted as all their n-grams up to
``max_depth`` tokens long, so the trie answers "what followed this context before?" for any
context suffix of up to ``max_depth - 1`` tokens, across requests. A request keeps the trie
nodes of its current suffixes (its *frontier*), so appending one token costs O(max_depth).

Drafting (`propose_tree`, SGLang's BFS match): take the deepest frontier node that has a child
(the longest context seen before), take its most frequent children (ties: the most recently
seen), as many as the context's length earns (--speculative-ngram-min/max-bfs-breadth), advance
the frontier virtually by each and repeat breadth first until the draft budget is spent. With
breadth 1 this is a chain: the most frequent continuation, token after token. Only verified tokens are ever
inserted, so rejected drafts never pollute the cache.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from radixserve.speculative.draft_tree import DraftTree

logger = logging.getLogger(__name__)


@dataclass(eq=False, slots=True)
class _Node:
    """About 100 bytes (most nodes are leaves, which never get a children dict)."""

    depth: int
    count: int = 0
    stamp: int = 0  # insertion clock of the last visit: recency breaks count ties
    children: dict[int, _Node] | None = None

    def ranked_children(self) -> list[int]:
        """Tokens that followed, most frequent first (ties: the most recently seen)."""
        if not self.children:
            return []
        ranked = sorted(self.children.items(), key=lambda kv: (kv[1].count, kv[1].stamp))
        return [token for token, _ in reversed(ranked)]

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

    def propose_tree(
        self, frontier: Frontier, num_tokens: int, min_breadth: int, max_breadth: int
    ) -> DraftTree:
        """Up to ``num_tokens`` draft nodes, breadth first: each node gets the likeliest
        continuations of its longest context seen before, as many as `breadth_for` allows for
        that context's length (a long match is trusted with one branch, a short one gets up to
        max_breadth)."""
        if frontier.generation != self.generation or num_tokens <= 0:
            return DraftTree()
        tokens: list[int] = []
        parents: list[int] = []
        queue: deque[tuple[int, list[_Node]]] = deque([(0, frontier.nodes)])
        while queue and len(tokens) < num_tokens:
            node, nodes = queue.popleft()
            match = _longest_match(nodes)
            if match is None:
                continue
            breadth = self.breadth_for(match.depth, min_breadth, max_breadth)
            for token in match.ranked_children()[:breadth]:
                if len(tokens) == num_tokens:
                    break
                tokens.append(token)
                parents.append(node)
                queue.append((len(tokens), self._advance(nodes, token)))
        return DraftTree(tuple(tokens), tuple(parents))

    def breadth_for(self, context_len: int, min_breadth: int, max_breadth: int) -> int:
        """Branches for a match on `context_len` tokens: max_breadth for a single-token match,
        falling linearly to min_breadth for the longest context the trie holds."""
        longest = self.max_depth - 1
        if longest <= 1 or max_breadth <= min_breadth:
            return max(1, min_breadth)
        share = (context_len - 1) / (longest - 1)
        return max(1, round(max_breadth - (max_breadth - min_breadth) * share))

    def _advance(self, nodes: list[_Node], token: int) -> list[_Node]:
        """The frontier after a (virtual) next token."""
        advanced = [self.root]
        for n in nodes:
            child = n.child(token)
            if child is not None and child.depth < self.max_depth:
                advanced.append(child)
        return advanced


def _longest_match(nodes: list[_Node]) -> _Node | None:
    """The deepest frontier node with a continuation (a bare unigram guess, from the root, is
    too weak to spend verify work on)."""
    for node in reversed(nodes):
        if node.depth == 0:
            return None
        if node.children:
            return node
    return None
