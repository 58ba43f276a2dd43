"""STANDALONE speculation: a small draft model with its own KV pool proposes a chain of drafts.

The draft keeps, per running request, the KV of a prefix of the request's verified tokens
(``req.spec_state`` is that length) in its own pool: one slot per token (page size 1), rows of
its request-to-token table indexed like the target's (the request's req_pool_idx). A round:

1. catch up: one extend of every request's tokens the draft has not seen (the whole prompt on
   the first round, one or two tokens later), logits at the last one give draft 1;
2. ``num_steps - 1`` decode steps, each feeding back the previous draft (greedy, so drafts are
   a deterministic function of the context and acceptance.py's rule stays exact);
3. after verification the scheduler keeps m drafts; `commit` keeps the draft KV that is still
   valid (positions before the first unverified token) and frees the rest.

With --speculative-eagle-topk k > 1 step 2 grows a tree instead (tree_search.py): each step runs
the k frontier nodes of every request as decode rows, each on a row of a small table holding the
request's verified slots and the node's path of scratch slots. The scratch KV is freed when the
round's proposals are made; the next catch-up runs the tokens that were accepted.

The draft pool holds no prefix cache, so its slots are freed whenever the target releases the
request (KVManager release hooks). A request the draft pool cannot fit just gets no drafts.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from radixserve.mem_cache.allocator import TokenToKVPoolAllocator
from radixserve.model_executor.model_runner import ModelRunner
from radixserve.model_executor.step_builder import StepBuilder, paths_table
from radixserve.model_executor.step_io import StepInputs
from radixserve.speculative.draft_tree import DraftTree
from radixserve.speculative.drafter import ReadsNoFeatures
from radixserve.speculative.tree_search import Frontier, ScratchSlots, TreeSearch, grow_searches

if TYPE_CHECKING:
    from radixserve.managers.schedule_batch import Req
    from radixserve.server_args import ServerArgs
    from radixserve.speculative.target import RowArgmax

logger = logging.getLogger(__name__)


def draft_server_args(
    target_args: ServerArgs, path: str, pool_tokens: int, **overrides: Any
) -> ServerArgs:
    """The target's settings for a draft's own runner: its checkpoint, a KV pool of
    `pool_tokens` one-token pages, unquantized (plus `overrides`). An FP8 KV cache's
    --quantization-param-path scales are the target's layers': the draft takes its own
    checkpoint's, else 1.0."""
    return dataclasses.replace(
        target_args,
        model_path=path,
        tokenizer_path=None,
        max_total_tokens=pool_tokens,
        page_size=1,
        quantization=None,
        quantization_param_path=None,
        **overrides,
    )


def check_draft_vocab(runner: ModelRunner, target_vocab: int, what: str) -> None:
    vocab = runner.model_config.vocab_size
    if vocab != target_vocab:
        raise ValueError(
            f"--speculative-draft-model-path: the {what}'s vocabulary ({vocab}) differs from "
            f"the target's ({target_vocab}); the two must share a tokenizer"
        )


def draft_kv_pool(
    runner: ModelRunner, max_reqs: int, context_len: int
) -> tuple[TokenToKVPoolAllocator, torch.Tensor]:
    """A draft's own KV pool: an allocator of one slot per token over the runner's KV cache,
    and a request-to-token table whose rows are indexed by the target's req_pool_idx."""
    allocator = TokenToKVPoolAllocator(runner.plan.max_total_tokens, 1, runner.device)
    table = torch.zeros((max_reqs, context_len), dtype=torch.int64, device=runner.device)
    return allocator, table


class DraftModel(ReadsNoFeatures):
    """A smaller model of the target's vocabulary drafting chains (or top-k trees) with its
    own KV pool; a Drafter (drafter.py)."""

    def __init__(
        self,
        target_args: ServerArgs,
        draft_path: str,
        pool_tokens: int,
        max_reqs: int,
        context_len: int,
        target_vocab: int,
        argmax: RowArgmax,
        topk: int = 1,
        num_steps: int = 1,
    ) -> None:
        self.argmax = argmax  # greedy drafts: the target's row-wise argmax
        self.topk = topk
        self.num_steps = num_steps
        self.runner = ModelRunner(draft_server_args(target_args, draft_path, pool_tokens))
        check_draft_vocab(self.runner, target_vocab, "draft model")
        # A row is in use while the request's spec_state (tokens the draft has seen) is not None.
        self.allocator, self.req_to_token = draft_kv_pool(self.runner, max_reqs, context_len)
        self.context_len = context_len
        logger.info("Draft model %s: KV pool of %d tokens", draft_path, self.allocator.size)

    # -- proposing --------------------------------------------------------------------------
    def propose(self, reqs: Sequence[Req], rooms: Sequence[int]) -> list[DraftTree]:
        """Up to rooms[i] drafts for each request (0: none): a chain, or with topk > 1 a tree
        (its KV is scratch, freed before this returns)."""
        if self.topk > 1:
            return self._propose_trees(reqs, rooms)
        return [DraftTree.chain(d) for d in self._propose_chains(reqs, rooms)]

    def _propose_chains(self, reqs: Sequence[Req], rooms: Sequence[int]) -> list[list[int]]:
        drafts: list[list[int]] = [[] for _ in reqs]
        live = [i for i, room in enumerate(rooms) if room > 0 and self._reserve(reqs[i], room)]
        if not live:
            return drafts
        # Catch up: every unseen verified token, logits at the last.
        step = self._catch_up_inputs([reqs[i] for i in live])
        tokens = self.argmax(self._forward(step)).tolist()
        for j, i in enumerate(live):
            drafts[i].append(tokens[j])
            reqs[i].spec_state = reqs[i].seq_len
        for _ in range(max(rooms[i] for i in live) - 1):
            live = [i for i in live if len(drafts[i]) < rooms[i]]
            if not live:
                break
            inputs = self._decode_inputs([reqs[i] for i in live], drafts, live)
            tokens = self.argmax(self._forward(inputs)).tolist()
            for j, i in enumerate(live):
                reqs[i].spec_state += 1
                drafts[i].append(tokens[j])
        return drafts

    def _propose_trees(self, reqs: Sequence[Req], rooms: Sequence[int]) -> list[DraftTree]:
        trees = [DraftTree() for _ in reqs]
        live = [i for i, room in enumerate(rooms) if room > 0 and self._reserve(reqs[i], 1)]
        if not live:
            return trees
        logits = self._forward(self._catch_up_inputs([reqs[i] for i in live]))
        searches = {i: TreeSearch(self.topk) for i in live}
        for j, i in enumerate(live):
            reqs[i].spec_state = reqs[i].seq_len
            searches[i].grow(-1, torch.log_softmax(logits[j], dim=-1))
            searches[i].advance()

        def run_frontier(frontier: Frontier, scratch: ScratchSlots) -> torch.Tensor:
            step_inputs, table = self._frontier_inputs(reqs, searches, frontier, scratch)
            return self.runner.forward(step_inputs, table).full_logits()

        grow_searches(searches, rooms, self.num_steps, self.allocator, run_frontier)
        for i in live:
            trees[i] = searches[i].select(rooms[i])
        return trees

    def _frontier_inputs(
        self,
        reqs: Sequence[Req],
        searches: dict[int, TreeSearch],
        frontier: Sequence[tuple[int, int]],
        scratch: dict[tuple[int, int], int],
    ) -> tuple[StepInputs, torch.Tensor]:
        """One decode row per frontier node: its token at its position, attending to the
        request's verified tokens and the node's own path of drafts (a table row each)."""
        paths = [searches[i].path(node) for i, node in frontier]
        seen = [reqs[i].spec_state for i, _ in frontier]
        table = paths_table(
            self.req_to_token,
            [
                (reqs[i].req_pool_idx, s, [scratch[(i, n)] for n in path])
                for (i, _), path, s in zip(frontier, paths, seen, strict=True)
            ],
        )
        step = StepBuilder()
        for k, ((i, node), path, s) in enumerate(zip(frontier, paths, seen, strict=True)):
            position = s + len(path) - 1
            step.add(
                k,
                position,
                [searches[i].nodes[node].token],
                slots=[scratch[(i, node)]],
            )
        # One-token extends, not decode steps: under --enable-torch-compile a decode step runs
        # a graph compiled for a fixed table shape, and this table's changes per round.
        return step.build(is_decode=False), table

    def _reserve(self, req: Req, room: int) -> bool:
        """Draft slots for the catch-up tokens and room - 1 fed-back drafts."""
        assert req.req_pool_idx is not None
        seen = req.spec_state or 0
        need = req.seq_len - seen + room - 1
        if req.seq_len + room - 1 > self.context_len:
            return False
        slots = self.allocator.alloc(need)
        if slots is None:
            return False
        self.req_to_token[req.req_pool_idx, seen : seen + need] = slots
        req.spec_state = seen
        return True

    def _catch_up_inputs(self, reqs: Sequence[Req]) -> StepInputs:
        step = StepBuilder()
        for req in reqs:
            seen = req.spec_state
            step.add(
                req.req_pool_idx,
                seen,
                req.fill_slice(seen, req.seq_len),
                slots=self._slots(req, seen, req.seq_len),
            )
        return step.build()

    def _decode_inputs(
        self, reqs: Sequence[Req], drafts: Sequence[list[int]], live: Sequence[int]
    ) -> StepInputs:
        step = StepBuilder()
        for req, i in zip(reqs, live, strict=True):
            p = req.spec_state
            step.add(req.req_pool_idx, p, [drafts[i][-1]], slots=self._slots(req, p, p + 1))
        return step.build(is_decode=True)

    def _forward(self, step: StepInputs) -> torch.Tensor:
        return self.runner.forward(step, self.req_to_token).full_logits()

    def _slots(self, req: Req, start: int, end: int) -> torch.Tensor:
        return self.req_to_token[req.req_pool_idx, start:end].clone()

    # -- KV bookkeeping ---------------------------------------------------------------------
    @property
    def prunes_by_grammar(self) -> bool:
        """Chains are not cut where a grammar refuses a draft: the draft KV bookkeeping
        (commit) follows the drafted chain; a refused draft is simply never accepted."""
        return self.topk > 1

    def commit(self, req: Req, num_drafts: int, num_kept: int) -> None:
        """After verification, keep the draft KV of verified positions only.

        The round left the draft holding positions [0, seq_len0 + num_drafts - 1): the verified
        tokens, then drafts 1 .. num_drafts - 1 fed back at seq_len0 onwards. Of those, the
        first num_kept drafts turned out verified; later positions are freed.
        """
        if req.req_pool_idx is None or not req.spec_state or not num_drafts or self.topk > 1:
            return  # a tree round keeps no draft KV past the verified tokens
        seen = req.spec_state
        start = seen - (num_drafts - 1)  # seq_len before the round
        valid = min(seen, start + min(num_kept, num_drafts - 1))
        allocated_end = start + num_drafts - 1
        if valid < allocated_end:
            self.allocator.free(self._slots(req, valid, allocated_end))
        req.spec_state = valid

    def release(self, req: Req) -> None:
        """Free everything the draft holds for a request the target released."""
        if req.req_pool_idx is None or not req.spec_state:
            req.spec_state = None
            return
        self.allocator.free(self._slots(req, 0, req.spec_state))
        req.spec_state = None

    def reset(self) -> None:
        """Forget every owner (the target's KV bookkeeping was reset after a failed step)."""
        self.allocator.clear()
