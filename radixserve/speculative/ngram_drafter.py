"""NGRAM drafting behind the Drafter interface (drafter.py): one n-gram trie shared by every
request (ngram_cache.py), brought up to date with each request's verified tokens before it
proposes; breadth first, a tree of --speculative-ngram-min/max-bfs-breadth branches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from radixserve.speculative.draft_tree import DraftTree
from radixserve.speculative.drafter import ReadsNoFeatures
from radixserve.speculative.ngram_cache import NgramCache

if TYPE_CHECKING:
    from radixserve.managers.schedule_batch import Req


class NgramDrafter(ReadsNoFeatures):
    prunes_by_grammar = True

    def __init__(
        self, max_trie_depth: int, capacity: int, min_breadth: int, max_breadth: int
    ) -> None:
        self.cache = NgramCache(max_trie_depth, capacity)
        self.min_breadth = min_breadth
        self.max_breadth = max_breadth

    def propose(self, reqs: Sequence[Req], rooms: Sequence[int]) -> list[DraftTree]:
        return [self._propose(req, room) for req, room in zip(reqs, rooms, strict=True)]

    def _propose(self, req: Req, room: int) -> DraftTree:
        # Every running request syncs, drafting or not: the trie learns all verified tokens.
        req.spec_state = self.cache.sync(req.spec_state, req.fill_ids)
        if room <= 0:
            return DraftTree()
        return self.cache.propose_tree(req.spec_state, room, self.min_breadth, self.max_breadth)

    def commit(self, req: Req, num_drafts: int, num_kept: int) -> None:
        """Nothing to do: the next sync reads the kept tokens from the request."""

    def release(self, req: Req) -> None:
        """Nothing held per request beyond its trie frontier (req.spec_state)."""

    def reset(self) -> None:
        """The trie holds tokens, not KV: it stays valid."""
