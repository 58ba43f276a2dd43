"""The draft tree a draft model proposes with --speculative-eagle-topk k > 1 (EAGLE's search).

Step 1 takes the k likeliest tokens after the request's last verified token. Each later step
runs the draft model on the current frontier (k nodes), takes the k likeliest children of each,
and keeps the k best of those k * k by path score (the sum of the draft's log-probabilities
along the path) as the next frontier. After the last step the `budget` best nodes of all kept
ones form the tree. A parent's score is at least its child's and the parent was kept first, so
the chosen nodes always include their ancestors. The search is deterministic given the context,
which the acceptance rule (acceptance.py) relies on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from radixserve.speculative.draft_tree import DraftTree

if TYPE_CHECKING:
    from radixserve.mem_cache.allocator import TokenToKVPoolAllocator

# (request index, search node) pairs of a step, and each one's scratch KV slot.
Frontier = list[tuple[int, int]]
ScratchSlots = dict[tuple[int, int], int]


@dataclass(frozen=True)
class SearchNode:
    token: int
    parent: int  # index into TreeSearch.nodes; -1: the last verified token
    depth: int
    score: float


@dataclass
class TreeSearch:
    topk: int
    nodes: list[SearchNode] = field(default_factory=list)
    frontier: list[int] = field(default_factory=list)
    _pending: list[SearchNode] = field(default_factory=list)

    def grow(self, parent: int, logprobs: torch.Tensor) -> None:
        """Candidates after node `parent` (-1: the root) from the draft's log-probabilities."""
        base = self.nodes[parent] if parent >= 0 else None
        values, tokens = logprobs.topk(self.topk)
        for value, token in zip(values.tolist(), tokens.tolist(), strict=True):
            self._pending.append(
                SearchNode(
                    token=token,
                    parent=parent,
                    depth=base.depth + 1 if base else 1,
                    # min(): rounding must never rank a child above its parent.
                    score=(base.score if base else 0.0) + min(value, 0.0),
                )
            )

    def advance(self) -> list[int]:
        """Keep the best `topk` candidates grown this step; returns the new frontier."""
        best = sorted(self._pending, key=lambda n: -n.score)[: self.topk]
        self._pending = []
        first = len(self.nodes)
        self.nodes.extend(best)
        self.frontier = list(range(first, len(self.nodes)))
        return self.frontier

    def path(self, node: int) -> list[int]:
        """Nodes from depth 1 down to `node`."""
        nodes: list[int] = []
        while node >= 0:
            nodes.append(node)
            node = self.nodes[node].parent
        return nodes[::-1]

    def select(self, budget: int) -> DraftTree:
        """The `budget` best nodes as a DraftTree (parents before children)."""
        chosen = sorted(range(len(self.nodes)), key=lambda i: (-self.nodes[i].score, i))[:budget]
        chosen.sort(key=lambda i: (self.nodes[i].depth, i))
        index = {node: k for k, node in enumerate(chosen, start=1)}
        return DraftTree(
            tuple(self.nodes[i].token for i in chosen),
            tuple(index.get(self.nodes[i].parent, 0) for i in chosen),
        )


def grow_searches(
    searches: Mapping[int, TreeSearch],
    rooms: Sequence[int],
    num_steps: int,
    allocator: TokenToKVPoolAllocator,
    run_frontier: Callable[[Frontier, ScratchSlots], torch.Tensor],
) -> None:
    """Steps 2 .. num_steps of every request's search (step 1 grew from the catch-up): each
    step gives the frontier nodes one scratch KV slot each and `run_frontier` returns their
    logits. Stops early when scratch KV runs out; the scratch is freed before returning (the
    next round's catch-up runs the tokens that were accepted)."""
    scratch: ScratchSlots = {}
    try:
        for depth in range(1, min(num_steps, max(rooms[i] for i in searches))):
            frontier = [(i, n) for i in searches if depth < rooms[i] for n in searches[i].frontier]
            slots = allocator.alloc(len(frontier)) if frontier else None
            if slots is None:
                break  # no scratch KV left (or nothing to grow): verify what there is
            scratch.update(zip(frontier, slots.tolist(), strict=True))
            logits = run_frontier(frontier, scratch)
            for j, (i, node) in enumerate(frontier):
                searches[i].grow(node, torch.log_softmax(logits[j], dim=-1))
            for i in {i for i, _ in frontier}:
                searches[i].advance()
    finally:
        if scratch:
            allocator.free(torch.tensor(list(scratch.values()), dtype=torch.int64))
