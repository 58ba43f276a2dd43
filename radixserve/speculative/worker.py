"""The drafting side of speculative decoding: each decode round's draft trees.

The drafter (drafter.py's interface: NGRAM, a draft model, an EAGLE head) is picked here
from the options. The batch former asks `propose` for every running request's drafts when it
forms a decode batch; the batch then runs through the step runner like any other (its verify forward:
model_executor/verify_inputs.py; acceptance: verify.py), and the output processor reports each
request's kept drafts back through `committed`, after trimming the KV of the positions not kept.

A request's drafts never run past its max_new_tokens or the context length; a constrained
request's drafts are pruned where the grammar refuses them (grammar_drafts.py). Seeded requests
(whose draw depends on the step) get no drafts and are sampled by the plain sampler in the same
pass, so their output is the same with and without speculation.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from radixserve.speculative.adaptive import DraftBudget
from radixserve.speculative.draft_model import DraftModel
from radixserve.speculative.draft_tree import DraftTree
from radixserve.speculative.drafter import Drafter, speculable
from radixserve.speculative.eagle_draft import EAGLE_ALGORITHMS, EagleDraft
from radixserve.speculative.grammar_drafts import grammar_subtree
from radixserve.speculative.ngram_drafter import NgramDrafter

if TYPE_CHECKING:
    from radixserve.managers.schedule_batch import Req
    from radixserve.speculative.config import SpecConfig
    from radixserve.speculative.target import TargetSteps

logger = logging.getLogger(__name__)


class SpecWorker:
    def __init__(self, config: SpecConfig, step_runner: TargetSteps, context_len: int) -> None:
        self.config = config
        self.step_runner = step_runner
        self.context_len = context_len
        self.drafter = make_drafter(config, step_runner, context_len)
        # A drafter with a model of its own (its runner and KV pool), read by tests and tools.
        self.draft = self.drafter if isinstance(self.drafter, (DraftModel, EagleDraft)) else None
        kv = step_runner.kv
        # The drafter's memory follows the target's: freed when the target releases a request.
        kv.release_hooks.append(self.drafter.release)
        kv.reset_hooks.append(self.drafter.reset)
        if self.drafter.wants_features:
            step_runner.on_features = self.drafter.take_features

    @property
    def tokens_per_request(self) -> int:
        """KV slots one running request may take in a round."""
        return self.config.num_draft_tokens

    def propose(self, reqs: Sequence[Req]) -> list[DraftTree]:
        """Drafts for each request (possibly none), never past its max_new_tokens or the
        context length; a constrained request's are pruned where its grammar refuses them."""
        rooms = [
            min(
                self._draft_length(req),
                req.remaining_new_tokens() - 1,
                self.context_len - req.seq_len,
            )
            if speculable(req)
            else 0
            for req in reqs
        ]
        trees = self.drafter.propose(reqs, rooms)
        if not self.drafter.prunes_by_grammar:
            return trees
        return [
            grammar_subtree(req.grammar, tree) if req.grammar is not None and len(tree) else tree
            for req, tree in zip(reqs, trees, strict=True)
        ]

    def _draft_length(self, req: Req) -> int:
        if not self.config.adaptive:
            return self.config.max_drafts
        if req.spec_budget is None:
            req.spec_budget = DraftBudget(self.config.max_drafts)
        return req.spec_budget.next_drafts()

    def committed(self, req: Req, num_drafts: int, num_kept: int) -> None:
        """The scheduler kept num_kept of the request's num_drafts drafts this round."""
        self.drafter.commit(req, num_drafts, num_kept)
        if req.spec_budget is not None:
            req.spec_budget.record(num_drafts, num_kept)


def make_drafter(config: SpecConfig, target: TargetSteps, context_len: int) -> Drafter:
    """The drafter --speculative-algorithm names, on the target's runner and KV sizes."""
    kv = target.kv
    topk = config.eagle_topk if config.trees else 1
    if config.algorithm in EAGLE_ALGORITHMS:
        return EagleDraft(
            target.runner,
            config.algorithm,
            config.draft_model_path,
            pool_tokens=kv.allocator.size,
            max_reqs=kv.req_to_token_pool.max_reqs,
            context_len=context_len,
            topk=topk,
            num_steps=config.num_steps,
            token_map=config.token_map,
        )
    if config.algorithm == "STANDALONE":
        return DraftModel(
            target.runner.server_args,
            config.draft_model_path,
            pool_tokens=kv.allocator.size,
            max_reqs=kv.req_to_token_pool.max_reqs,
            context_len=context_len,
            target_vocab=target.runner.model_config.vocab_size,
            argmax=target.argmax,
            topk=topk,
            num_steps=config.num_steps,
        )
    low, high = config.ngram_min_bfs_breadth, config.ngram_max_bfs_breadth
    if not config.trees:
        low = high = 1
    return NgramDrafter(config.ngram_max_trie_depth, config.ngram_capacity, low, high)
