"""EAGLE / EAGLE3 speculation: a trained draft head proposes from the target's own features.

The head (models/llama_eagle.py, models/llama_eagle3.py) runs at position p on the embedding of
token p+1 and the target's features at p (EAGLE: the final normed hidden state; EAGLE3: the
inputs of three decoder layers), so it needs, per request, the target's features of every
position it has not consumed yet. The target's runner returns every token's features
(`ModelRunner.capture_final` / `capture_layers`); prefill chunks and verify rounds hand a
request's rows to `add_features` (a verify round: the rows of the verified token and of the
accepted drafts). Per request (`req.spec_state`, an EagleState) the head's own KV pool holds
positions [base, seen): `base` is where the features began (a prompt prefix served from the
radix cache has none: the head attends to the rest), `pending` the features not yet consumed.

A round: one catch-up extend over the pending positions (tokens seen+1 .. the last verified
token) gives the first draft(s) and the head's output at the last position; each later step
runs the frontier's drafts as one-token rows on scratch KV, fed the head's own output at the
parent node (EAGLE's recurrence), through the same top-k tree search as a draft model
(tree_search.py; a chain with top-k 1). Scratch KV is freed when the round's drafts are made:
the positions the target accepts are recomputed from its features at the next catch-up.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from radixserve.model_executor.model_runner import ModelRunner
from radixserve.model_executor.step_builder import StepBuilder, paths_table
from radixserve.model_executor.step_io import StepInputs
from radixserve.models.eagle_common import load_token_map
from radixserve.speculative.draft_model import check_draft_vocab, draft_kv_pool, draft_server_args
from radixserve.speculative.draft_tree import DraftTree
from radixserve.speculative.drafter import speculable
from radixserve.speculative.tree_search import Frontier, ScratchSlots, TreeSearch, grow_searches

if TYPE_CHECKING:
    from radixserve.managers.schedule_batch import Req

logger = logging.getLogger(__name__)

EAGLE_ALGORITHMS = ("EAGLE", "EAGLE3")


@dataclass
class EagleState:
    """The head's view of one request: KV for positions [base, seen), then target features
    for positions seen, seen + 1, ... (`pending`, in order)."""

    base: int
    seen: int
    pending: list[torch.Tensor] = field(default_factory=list)

    @property
    def held(self) -> int:
        """Positions whose head KV is held: the first `held` columns of the request's row."""
        return self.seen - self.base

    @property
    def pending_len(self) -> int:
        return sum(int(t.shape[0]) for t in self.pending)


class EagleDraft:
    """An EAGLE / EAGLE3 head drafting from the target's features; a Drafter (drafter.py)."""

    prunes_by_grammar = True
    wants_features = True

    def __init__(
        self,
        target: ModelRunner,
        algorithm: str,
        head_path: str,
        pool_tokens: int,
        max_reqs: int,
        context_len: int,
        topk: int = 1,
        num_steps: int = 1,
        token_map: str = "",
    ) -> None:
        self.topk = topk
        self.num_steps = num_steps
        args = draft_server_args(
            target.server_args,
            head_path,
            pool_tokens,
            # A head is always read from its files (also under --load-format dummy, which
            # benchmarks use for the target).
            load_format="auto",
            enable_torch_compile=False,
            enable_lora=None,
            lora_paths=None,
        )
        self.runner = ModelRunner(args, draft_head=True)
        head = self.runner.model
        want = "LlamaForCausalLMEagle3" if algorithm == "EAGLE3" else "LlamaForCausalLMEagle"
        if type(head).__name__ != want:
            raise ValueError(
                f"--speculative-draft-model-path {head_path} holds a {type(head).__name__} head; "
                f"--speculative-algorithm {algorithm} needs a {want}"
            )
        check_draft_vocab(self.runner, target.model_config.vocab_size, "head")
        head.share_target_parts(target.model)
        if token_map:
            ids = load_token_map(token_map, target.model_config.vocab_size)
            head.use_hot_tokens(ids.to(self.runner.device))
            logger.info("EAGLE head drafts %d tokens (--speculative-token-map)", ids.numel())
        layers = head.target_feature_layers(target.model_config.num_hidden_layers)
        if layers:
            target.capture_layers = layers
        else:
            target.capture_final = True
        self.allocator, self.req_to_token = draft_kv_pool(self.runner, max_reqs, context_len)
        self.context_len = context_len
        logger.info(
            "%s head %s: features from the target's %s, KV pool of %d tokens",
            algorithm,
            head_path,
            f"decoder layer inputs {list(layers)}" if layers else "final hidden states",
            self.allocator.size,
        )

    # -- features from the target -----------------------------------------------------------
    def take_features(
        self,
        reqs: Sequence[Req],
        starts: Sequence[int],
        lengths: Sequence[int],
        features: torch.Tensor,
    ) -> None:
        """A target step's features, flattened over its requests in order: a prefill's new
        tokens, or a verify forward's verified positions (the last token and the accepted
        drafts). Requests that never draft (seeded) and embedding requests keep none."""
        offset = 0
        for req, start, n in zip(reqs, starts, lengths, strict=True):
            if n and speculable(req) and not req.is_embedding:
                # A copy: a view would keep the whole batch's features alive.
                self.add_features(req, start, features[offset : offset + n].clone())
            offset += n

    def add_features(self, req: Req, start: int, rows: torch.Tensor) -> None:
        """The target computed features for positions [start, start + len(rows))."""
        state = req.spec_state
        if not isinstance(state, EagleState) or start != state.seen + state.pending_len:
            # New, or a gap (the request was restarted elsewhere): start over from here.
            self.release(req)
            state = req.spec_state = EagleState(base=start, seen=start)
        state.pending.append(rows)

    # -- proposing --------------------------------------------------------------------------
    def propose(self, reqs: Sequence[Req], rooms: Sequence[int]) -> list[DraftTree]:
        trees = [DraftTree() for _ in reqs]
        live = [i for i, room in enumerate(rooms) if room > 0 and self._catch_up_ready(reqs[i])]
        if not live:
            return trees
        step, last_rows = self._catch_up_inputs([reqs[i] for i in live])
        out = self.runner.forward(step, self.req_to_token)
        assert out.features is not None
        searches = {i: TreeSearch(self.topk) for i in live}
        # (request, search node) -> the head's output feature at that node (-1: the last
        # verified token), which its children's rows read.
        feature: dict[tuple[int, int], torch.Tensor] = {}
        for j, i in enumerate(live):
            state = reqs[i].spec_state
            state.seen = reqs[i].seq_len - 1
            state.pending = []
            feature[(i, -1)] = out.features[last_rows[j]]
            searches[i].grow(-1, torch.log_softmax(out.full_logits()[j], dim=-1))
            searches[i].advance()

        def run_frontier(frontier: Frontier, scratch: ScratchSlots) -> torch.Tensor:
            step = self._frontier_inputs(reqs, searches, frontier, scratch, feature)
            out = self.runner.forward(step, self._frontier_table(reqs, searches, frontier, scratch))
            assert out.features is not None
            for j, node in enumerate(frontier):
                feature[node] = out.features[j]
            return out.full_logits()

        grow_searches(searches, rooms, self.num_steps, self.allocator, run_frontier)
        for i in live:
            trees[i] = searches[i].select(rooms[i])
        return trees

    def _catch_up_ready(self, req: Req) -> bool:
        """Whether the head can run the request's pending positions now (KV reserved for them);
        a request whose features do not line up with its tokens is reset (no drafts until its
        next features arrive)."""
        state = req.spec_state
        if not isinstance(state, EagleState) or req.req_pool_idx is None:
            return False
        new = req.seq_len - 1 - state.seen
        if new <= 0 or state.pending_len != new:
            self.release(req)
            return False
        end = req.seq_len - 1 - state.base
        if end + self.num_steps > self.context_len:
            return False
        slots = self.allocator.alloc(new)
        if slots is None:
            return False
        self.req_to_token[req.req_pool_idx, state.held : end] = slots
        return True

    def _catch_up_inputs(self, reqs: Sequence[Req]) -> tuple[StepInputs, list[int]]:
        """One extend per request over its pending positions: at position p the token p + 1
        and the target's features at p; logits at the last (the first draft)."""
        step = StepBuilder()
        features: list[torch.Tensor] = []
        for req in reqs:
            state = req.spec_state
            n = req.seq_len - 1 - state.seen
            # The draft's table holds the request from its base on: slots are handed in.
            step.add(
                req.req_pool_idx,
                state.held,
                req.fill_slice(state.seen + 1, req.seq_len),
                positions=range(state.seen, req.seq_len - 1),
                slots=self.req_to_token[req.req_pool_idx, state.held : state.held + n],
            )
            features.extend(state.pending)
        return step.build(spec_hidden=torch.cat(features)), step.logits_rows

    def _frontier_inputs(
        self,
        reqs: Sequence[Req],
        searches: dict[int, TreeSearch],
        frontier: Sequence[tuple[int, int]],
        scratch: dict[tuple[int, int], int],
        feature: dict[tuple[int, int], torch.Tensor],
    ) -> StepInputs:
        """One row per frontier node: its token, one position past its parent's, reading the
        head's output at its parent; it attends to the request's consumed positions and the
        node's own path of scratch slots (a row of _frontier_table each)."""
        nodes = [searches[i].nodes[n] for i, n in frontier]
        seen = [reqs[i].spec_state.seen for i, _ in frontier]
        kv_before = [
            reqs[i].spec_state.held + node.depth - 1
            for (i, _), node in zip(frontier, nodes, strict=True)
        ]
        step = StepBuilder()
        for k, (node, s, before) in enumerate(zip(nodes, seen, kv_before, strict=True)):
            step.add(
                k,
                before,
                [node.token],
                positions=[s + node.depth - 1],
                slots=[scratch[frontier[k]]],
            )
        # One-token extends over a per-round table (as a draft model's tree steps).
        return step.build(
            is_decode=False,
            spec_hidden=torch.stack(
                [feature[(i, node.parent)] for (i, _), node in zip(frontier, nodes, strict=True)]
            ),
        )

    def _frontier_table(
        self,
        reqs: Sequence[Req],
        searches: dict[int, TreeSearch],
        frontier: Sequence[tuple[int, int]],
        scratch: dict[tuple[int, int], int],
    ) -> torch.Tensor:
        return paths_table(
            self.req_to_token,
            [
                (
                    reqs[i].req_pool_idx,
                    reqs[i].spec_state.held,
                    [scratch[(i, n)] for n in searches[i].path(node)],
                )
                for i, node in frontier
            ],
        )

    # -- KV bookkeeping ---------------------------------------------------------------------
    def commit(self, req: Req, num_drafts: int, num_kept: int) -> None:
        """Nothing to trim: drafts' KV is scratch, freed when the round's drafts were made (the
        verified positions' features arrive through take_features)."""

    def release(self, req: Req) -> None:
        """Free everything the head holds for a request the target released."""
        state = req.spec_state
        if isinstance(state, EagleState) and req.req_pool_idx is not None and state.held > 0:
            self.allocator.free(self.req_to_token[req.req_pool_idx, : state.held].clone())
        req.spec_state = None

    def reset(self) -> None:
        """Forget every owner (the target's KV bookkeeping was reset after a failed step)."""
        self.allocator.clear()
