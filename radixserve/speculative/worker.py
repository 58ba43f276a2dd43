"""One speculative decode round: propose drafts, verify them in one target forward, accept.

A running request normally decodes one token: its last token (not yet in the KV cache) runs at
position kv_len. In a speculative round it runs [last, d_1..d_n], the root and the nodes of its
draft tree (draft_tree.py; a chain when drafts do not branch), node i's KV in the slot at the
request's position kv_len + i and its RoPE position kv_len + depth(i), as extends over its cached
context (the same paged-attention path as a prefill on a cached prefix), with logits at every
node. A chain is one extend on the request's own table row; a tree is cut into chains, each an
extend on a row of a small table built for the round (context slots, then the chain's ancestors'
slots, then its own). Acceptance (acceptance.py) emits 1..depth+1 tokens along one branch; the
KV of that branch's drafts is copied to positions kv_len + 1, kv_len + 2, ... (`KVCache.
copy_slots`) where the tree put them elsewhere; the scheduler appends the tokens one by one
(finish checks after each), then `KVManager.trim` frees the slots of the positions that were not
kept, so KV and the radix cache only ever hold verified tokens.

Each verify row is processed as plain decoding would process that position: penalties and
min_new_tokens see the request's output plus the drafts on the node's path, and a grammar-
constrained request's row is masked by the grammar state after those drafts
(grammar_drafts.py), and a logprob request gets each emitted
token's logprob from its row. Seeded requests (whose draw depends on the step) get no drafts and
are sampled by the plain sampler in the same pass, so their output is the same with and without
speculation.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from radixserve.model_executor.step_builder import StepBuilder
from radixserve.model_executor.step_io import StepInputs
from radixserve.sampling.constrained.bitmask import allocate_bitmask
from radixserve.sampling.constrained.mask_apply import PackedVocabMask
from radixserve.sampling.custom_logit_processor import apply_processors
from radixserve.sampling.sampler import chosen_logprobs, scale_by_temperature
from radixserve.sampling.sampling_batch_info import SamplingBatchInfo
from radixserve.sampling.token_result import TokenResult
from radixserve.speculative.acceptance import accept_tree, target_probs
from radixserve.speculative.adaptive import DraftBudget
from radixserve.speculative.draft_model import DraftModel
from radixserve.speculative.draft_tree import DraftTree, paths_table
from radixserve.speculative.eagle_draft import EAGLE_ALGORITHMS, EagleDraft
from radixserve.speculative.grammar_drafts import fill_tree_masks, grammar_subtree
from radixserve.speculative.ngram_cache import NgramCache

if TYPE_CHECKING:
    from radixserve.managers.schedule_batch import Req
    from radixserve.speculative.config import SpecConfig
    from radixserve.speculative.target import TargetSteps

logger = logging.getLogger(__name__)


@dataclass
class SpecResult:
    """What one round produced for one request: the tokens to append, in order, and how
    many of them were accepted drafts (the last token is the target's own)."""

    tokens: list[TokenResult]
    num_drafts: int
    num_accepted: int


def speculable(req: Req) -> bool:
    """Whether drafts for `req` can be verified exactly by this module's acceptance rules."""
    return req.sampling_params.sampling_seed is None


class SpecWorker:
    def __init__(self, config: SpecConfig, step_runner: TargetSteps, context_len: int) -> None:
        self.config = config
        self.step_runner = step_runner
        self.context_len = context_len
        self.ngram: NgramCache | None = None
        self.draft: DraftModel | EagleDraft | None = None
        self.eagle: EagleDraft | None = None
        kv = step_runner.kv
        if config.algorithm in EAGLE_ALGORITHMS:
            self.draft = self.eagle = EagleDraft(
                step_runner.runner,
                config.algorithm,
                config.draft_model_path,
                pool_tokens=kv.allocator.size,
                max_reqs=kv.req_to_token_pool.max_reqs,
                context_len=context_len,
                topk=config.eagle_topk if config.trees else 1,
                num_steps=config.num_steps,
                token_map=config.token_map,
            )
            step_runner.on_features = self._prefill_features
        elif config.algorithm == "STANDALONE":
            runner = step_runner.runner
            self.draft = DraftModel(
                runner.server_args,
                config.draft_model_path,
                pool_tokens=kv.allocator.size,
                max_reqs=kv.req_to_token_pool.max_reqs,
                context_len=context_len,
                target_vocab=runner.model_config.vocab_size,
                topk=config.eagle_topk if config.trees else 1,
                num_steps=config.num_steps,
            )
        else:
            self.ngram = NgramCache(config.ngram_max_trie_depth, config.ngram_capacity)
        if self.draft is not None:
            # The draft's KV follows the target's: freed when the target releases a request.
            kv.release_hooks.append(self.draft.release)
            kv.reset_hooks.append(self.draft.reset)

    def _prefill_features(
        self,
        reqs: Sequence[Req],
        starts: Sequence[int],
        lengths: Sequence[int],
        features: torch.Tensor,
    ) -> None:
        """A prefill batch's features, flattened over its requests in order. Requests that
        never draft (seeded) and embedding requests keep none."""
        assert self.eagle is not None
        offset = 0
        for req, start, n in zip(reqs, starts, lengths, strict=True):
            if n and speculable(req) and not req.is_embedding:
                # A copy: a view would keep the whole batch's features alive.
                self.eagle.add_features(req, start, features[offset : offset + n].clone())
            offset += n

    @property
    def tokens_per_request(self) -> int:
        """KV slots one running request may take in a round."""
        return self.config.num_draft_tokens

    def propose(self, reqs: Sequence[Req]) -> list[DraftTree]:
        """Drafts for each request (possibly none), never past its max_new_tokens or the
        context length. Also brings the shared n-gram cache up to date with verified tokens."""
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
        if self.draft is not None:
            trees = self.draft.propose(reqs, rooms)
            if self.draft.topk == 1 and self.eagle is None:
                # Not cut: the draft model's KV bookkeeping (trim) follows the drafted chain; a
                # draft the grammar refuses is simply never accepted.
                return trees
        else:
            trees = [self._ngram_drafts(req, room) for req, room in zip(reqs, rooms, strict=True)]
        # A constrained request's drafts are pruned where the grammar refuses them.
        return [
            grammar_subtree(req.grammar, tree) if req.grammar is not None and len(tree) else tree
            for req, tree in zip(reqs, trees, strict=True)
        ]

    def _ngram_drafts(self, req: Req, room: int) -> DraftTree:
        assert self.ngram is not None
        req.spec_state = self.ngram.sync(req.spec_state, req.fill_ids)
        if room <= 0:
            return DraftTree()
        low, high = self.config.ngram_min_bfs_breadth, self.config.ngram_max_bfs_breadth
        if not self.config.trees:
            low = high = 1
        return self.ngram.propose_tree(req.spec_state, room, low, high)

    def _draft_length(self, req: Req) -> int:
        if not self.config.adaptive:
            return self.config.max_drafts
        if req.spec_budget is None:
            req.spec_budget = DraftBudget(self.config.max_drafts)
        return req.spec_budget.next_drafts()

    def committed(self, req: Req, num_drafts: int, num_kept: int) -> None:
        """The scheduler kept num_kept of the request's num_drafts drafts this round."""
        if self.draft is not None:
            self.draft.trim(req, num_drafts, num_kept)
        if req.spec_budget is not None:
            req.spec_budget.record(num_drafts, num_kept)

    def run(self, reqs: Sequence[Req], trees: Sequence[DraftTree]) -> list[SpecResult]:
        """Verify every request's drafts in one forward (their slots are already allocated at
        positions kv_len .. kv_len + len(tree))."""
        verify = self._build_inputs(reqs, trees)
        output = self.step_runner.runner.forward(verify.step, verify.table)
        logits = output.logits
        results: list[SpecResult | None] = [None] * len(reqs)
        plain = [i for i, t in enumerate(trees) if not t]
        # Per request, the draft nodes accepted (none for a request without drafts).
        paths: dict[int, list[int]] = {i: [] for i in plain}
        if plain:
            rows = [verify.node_rows[i][0] for i in plain]
            if any(reqs[i].custom_logit_processor is not None for i in plain):
                apply_processors(logits, rows, [reqs[i] for i in plain])
            sampled = self.step_runner.sample([reqs[i] for i in plain], logits[rows])
            for i, token in zip(plain, sampled, strict=True):
                results[i] = SpecResult([token], 0, 0)
        drafted = [i for i, t in enumerate(trees) if t]
        if drafted:
            accepted = self._accept(reqs, trees, drafted, logits, verify.node_rows)
            moves: list[tuple[int, int]] = []
            for i, (tokens, path) in zip(drafted, accepted, strict=True):
                # Every token but the last is an accepted draft.
                results[i] = SpecResult(tokens, len(trees[i]), len(tokens) - 1)
                paths[i] = path
                slots = verify.node_slots[i]
                moves.extend((slots[n], slots[d]) for d, n in enumerate(path, 1) if n != d)
            if moves:
                src, dst = zip(*moves, strict=True)
                self.step_runner.runner.copy_kv_slots(
                    torch.tensor(src, dtype=torch.int64), torch.tensor(dst, dtype=torch.int64)
                )
        if self.eagle is not None:
            for i, path in paths.items():
                self._verified_features(reqs[i], output.features, verify.node_rows[i], path)
        return [r for r in results if r is not None]

    def _verified_features(
        self, req: Req, features: torch.Tensor | None, rows: list[int], path: list[int]
    ) -> None:
        """EAGLE: the target's features at the verified token and the accepted drafts (the
        positions kv_len, kv_len + 1, ...) go to the head."""
        assert self.eagle is not None and features is not None
        if speculable(req):
            index = torch.tensor([rows[n] for n in [0, *path]], dtype=torch.int64)
            self.eagle.add_features(req, req.kv_len, features[index])

    def _accept(
        self,
        reqs: Sequence[Req],
        trees: Sequence[DraftTree],
        drafted: list[int],
        logits: torch.Tensor,
        node_rows: list[list[int]],
    ) -> list[tuple[list[TokenResult], list[int]]]:
        """Per drafted request: the emitted tokens and the accepted draft nodes."""
        rows = [r for i in drafted for r in node_rows[i]]
        block = logits[rows]  # drafted requests' nodes, in node order
        if any(reqs[i].custom_logit_processor is not None for i in drafted):
            # Each node's row sees the request as plain decoding would at that position.
            views = [
                PathView(reqs[i], trees[i].path_tokens(n))
                for i in drafted
                for n in range(len(trees[i]) + 1)
            ]
            apply_processors(block, list(range(len(rows))), views)
        params = [reqs[i].sampling_params for i in drafted for _ in node_rows[i]]
        mask = self._verify_grammar_mask(reqs, trees, drafted, block.shape[-1])
        raw = all(
            reqs[i].sampling_params.samples_raw_argmax(len(reqs[i].output_ids) + depth)
            for i in drafted
            for depth in trees[i].depths
        )
        want_logprobs = any(reqs[i].return_logprob for i in drafted)
        probs = None
        scaled = None
        if mask is None and raw and not want_logprobs:
            argmax = block.argmax(dim=-1).tolist()
        else:
            # Node n's row sees the output plus the drafts on n's path (penalty counts,
            # min_new_tokens), as plain decoding would at that position.
            outputs = [
                reqs[i].output_ids + trees[i].path_tokens(n)
                for i in drafted
                for n in range(len(trees[i]) + 1)
            ]
            info = SamplingBatchInfo.from_requests(
                params,
                outputs,
                vocab_size=block.shape[-1],
                device=block.device,
                eos_token_ids=self.step_runner.eos_token_ids,
                grammar_mask=mask,
            )
            processed = info.process_logits(block)
            argmax = processed.argmax(dim=-1).tolist()
            if not all(p.is_greedy for p in params):
                probs = target_probs(processed, info).cpu()
            if want_logprobs:
                scaled = scale_by_temperature(processed, info)
        out: list[tuple[list[TokenResult], list[int]]] = []
        offset = 0
        for i in drafted:
            width = len(trees[i]) + 1
            if reqs[i].sampling_params.is_greedy or probs is None:
                tokens, path = accept_tree(trees[i], argmax[offset : offset + width], None)
            else:
                tokens, path = accept_tree(trees[i], None, probs[offset : offset + width])
            if reqs[i].return_logprob:
                assert scaled is not None
                emitting = [offset + n for n in [0, *path][: len(tokens)]]
                out.append((_with_logprobs(reqs[i], tokens, scaled[emitting]), path))
            else:
                out.append(([TokenResult(t, 0.0) for t in tokens], path))
            offset += width
        return out

    @staticmethod
    def _verify_grammar_mask(
        reqs: Sequence[Req], trees: Sequence[DraftTree], drafted: list[int], vocab_size: int
    ) -> PackedVocabMask | None:
        """The packed grammar mask of the verify rows (drafted requests' rows, in node order);
        None when no drafted request is constrained."""
        if all(reqs[i].grammar is None for i in drafted):
            return None
        bitmask = allocate_bitmask(sum(len(trees[i]) + 1 for i in drafted), vocab_size)
        masked: list[int] = []
        offset = 0
        for i in drafted:
            matcher = reqs[i].grammar
            if matcher is not None:
                matcher.check_logits_width(vocab_size)
                filled = fill_tree_masks(matcher, trees[i], bitmask, offset)
                masked.extend(offset + node for node in filled)
            offset += len(trees[i]) + 1
        return PackedVocabMask(bitmask, tuple(sorted(masked)), vocab_size)

    def _build_inputs(self, reqs: Sequence[Req], trees: Sequence[DraftTree]) -> VerifyInputs:
        """Flatten the round: one extend per chain of each request's tree (one per request when
        no tree branches, on the request's own table row)."""
        pool = self.step_runner.kv.req_to_token_pool
        branching = any(not tree.is_chain for tree in trees)
        step = StepBuilder(with_lora=self.step_runner.runner.lora is not None)
        node_rows: list[list[int]] = []
        node_slots: list[list[int]] = []
        table_rows: list[tuple[int, int, list[int]]] = []  # (pool row, context len, tail)
        for req, tree in zip(reqs, trees, strict=True):
            assert req.req_pool_idx is not None
            tokens = [req.fill_ids[-1], *tree.tokens]
            slots = pool.read(req.req_pool_idx, req.kv_len, req.kv_len + 1 + len(tree)).tolist()
            rows = [0] * len(tokens)
            for chain in tree.chains() if branching else [list(range(len(tokens)))]:
                first = chain[0]
                ancestors = [0, *tree.path(tree.parents[first - 1])] if first else []
                if branching:
                    table_rows.append(
                        (req.req_pool_idx, req.kv_len, [slots[n] for n in ancestors + chain])
                    )
                    row = len(table_rows) - 1
                else:
                    row = req.req_pool_idx
                for k, node in enumerate(chain):
                    rows[node] = len(step.input_ids) + k
                step.add(
                    row,
                    prefix=req.kv_len + tree.depths[first],
                    input_ids=[tokens[n] for n in chain],
                    positions=[req.kv_len + tree.depths[n] for n in chain],
                    slots=[slots[n] for n in chain],
                    lora_id=req.lora_id,
                    logits="all",
                )
            node_rows.append(rows)
            node_slots.append(slots)
        table = pool.req_to_token
        if branching:
            table = paths_table(pool.req_to_token, table_rows)
        return VerifyInputs(step.build(), table, node_rows, node_slots)


class PathView:
    """A request as a custom logit processor sees it at one verify row: its output ids plus
    the drafts on the row's path; everything else (and any error the processor leaves, e.g.
    `custom_logit_error`) is the request's own."""

    def __init__(self, req: Req, drafts: list[int]) -> None:
        object.__setattr__(self, "_req", req)
        object.__setattr__(self, "output_ids", req.output_ids + drafts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._req, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._req, name, value)


@dataclass
class VerifyInputs:
    """A verify forward: its steps and table, and per request the logits row and KV slot of
    each tree node (node 0: the last verified token)."""

    step: StepInputs
    table: torch.Tensor
    node_rows: list[list[int]]
    node_slots: list[list[int]]


def _with_logprobs(req: Req, tokens: list[int], scaled: torch.Tensor) -> list[TokenResult]:
    """Tokens emitted from consecutive verify rows with the logprobs (and top logprobs) the
    sampler reports: row j's processed, temperature-scaled logits, as plain decoding's step at
    that position would have them."""
    k = req.top_logprobs_num
    chosen = chosen_logprobs(scaled, torch.tensor(tokens), k)
    logprobs = chosen.logprobs.tolist()
    results = [TokenResult(t, lp) for t, lp in zip(tokens, logprobs, strict=True)]
    if k and chosen.top_logprobs is not None:
        values, ids = chosen.top_logprobs
        for j, result in enumerate(results):
            result.top_logprobs = list(zip(values[j].tolist(), ids[j].tolist(), strict=True))
    named = list(req.token_ids_logprob or ()) if req.return_logprob else []
    if named:  # token_ids_logprob: the same rows, read at the request's named ids
        rows = torch.log_softmax(scaled.float(), dim=-1)[:, named].tolist()
        for result, row in zip(results, rows, strict=True):
            result.ids_logprobs = list(zip(row, named, strict=True))
    return results
