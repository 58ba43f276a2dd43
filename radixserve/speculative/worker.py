"""One speculative decode round: propose drafts, verify them in one target forward, accept.

A running request normally decodes one token: its last token (not yet in the KV cache) runs at
position kv_len. In a speculative round it runs [last, d_1..d_k] at positions kv_len..kv_len+k
as one extend over its cached context (the same paged-attention path as a prefill on a cached
prefix), with logits at every position. Acceptance (acceptance.py) emits 1..k+1 tokens; the
scheduler appends them one by one (finish checks after each), then `KVManager.trim` frees the
slots of the positions that were not kept, so KV and the radix cache only ever hold verified
tokens.

Each verify row is processed as plain decoding would process that position: penalties and
min_new_tokens see the request's output plus the drafts before the row, and a grammar-
constrained request's row is masked by the grammar state after those drafts
(grammar_drafts.py), and a logprob request gets each emitted token's logprob from its row.
Seeded requests (whose draw depends on the step) get no drafts and are sampled by the plain
sampler in the same pass, so their output is the same with and without speculation.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixserve.managers.step_runner import TokenResult, argmax_of_raw_logits
from radixserve.model_executor.model_runner import StepInputs
from radixserve.sampling.constrained.bitmask import allocate_bitmask
from radixserve.sampling.constrained.mask_apply import PackedVocabMask
from radixserve.sampling.sampler import _scale, chosen_logprobs
from radixserve.sampling.sampling_batch_info import SamplingBatchInfo
from radixserve.speculative.acceptance import accept_greedy, accept_sampled, target_probs
from radixserve.speculative.adaptive import DraftBudget
from radixserve.speculative.draft_model import DraftModel
from radixserve.speculative.grammar_drafts import fill_verify_masks, grammar_prefix
from radixserve.speculative.ngram_cache import NgramCache

if TYPE_CHECKING:
    from radixserve.managers.schedule_batch import Req
    from radixserve.managers.step_runner import StepRunner
    from radixserve.speculative.config import SpecConfig

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
    def __init__(self, config: SpecConfig, step_runner: StepRunner, context_len: int) -> None:
        self.config = config
        self.step_runner = step_runner
        self.context_len = context_len
        self.ngram: NgramCache | None = None
        self.draft: DraftModel | None = None
        if config.algorithm == "STANDALONE":
            runner = step_runner.runner
            kv = step_runner.kv
            self.draft = DraftModel(
                runner.server_args,
                config.draft_model_path,
                pool_tokens=kv.allocator.size,
                max_reqs=kv.req_to_token_pool.max_reqs,
                context_len=context_len,
                target_vocab=runner.model_config.vocab_size,
            )
            # The draft's KV follows the target's: freed when the target releases a request.
            kv.release_hooks.append(self.draft.release)
            kv.reset_hooks.append(self.draft.reset)
        else:
            self.ngram = NgramCache(config.ngram_max_trie_depth, config.ngram_capacity)

    @property
    def tokens_per_request(self) -> int:
        """KV slots one running request may take in a round."""
        return self.config.num_draft_tokens

    def propose(self, reqs: Sequence[Req]) -> list[list[int]]:
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
            return self.draft.propose(reqs, rooms)
        assert self.ngram is not None
        drafts: list[list[int]] = []
        for req, room in zip(reqs, rooms, strict=True):
            req.spec_state = self.ngram.sync(req.spec_state, req.fill_ids)
            draft = self.ngram.propose(req.spec_state, room) if room > 0 else []
            if draft and req.grammar is not None:
                draft = grammar_prefix(req.grammar, draft)
            drafts.append(draft)
        return drafts

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

    def run(self, reqs: Sequence[Req], drafts: Sequence[list[int]]) -> list[SpecResult]:
        """Verify every request's drafts in one forward (their slots are already allocated at
        positions kv_len .. kv_len + len(drafts))."""
        step, first_rows = self._build_inputs(reqs, drafts)
        kv = self.step_runner.kv
        logits = self.step_runner.runner.forward(step, kv.req_to_token_pool.req_to_token).logits
        results: list[SpecResult | None] = [None] * len(reqs)
        plain = [i for i, d in enumerate(drafts) if not d]
        if plain:
            rows = [first_rows[i] for i in plain]
            sampled = self.step_runner.sample([reqs[i] for i in plain], logits[rows])
            for i, token in zip(plain, sampled, strict=True):
                results[i] = SpecResult([token], 0, 0)
        drafted = [i for i, d in enumerate(drafts) if d]
        if drafted:
            accepted = self._accept(reqs, drafts, drafted, logits, first_rows)
            for i, tokens in zip(drafted, accepted, strict=True):
                # Every token but the last is an accepted draft.
                results[i] = SpecResult(tokens, len(drafts[i]), len(tokens) - 1)
        return [r for r in results if r is not None]

    def _accept(
        self,
        reqs: Sequence[Req],
        drafts: Sequence[list[int]],
        drafted: list[int],
        logits: torch.Tensor,
        first_rows: list[int],
    ) -> list[list[TokenResult]]:
        rows = [
            r for i in drafted for r in range(first_rows[i], first_rows[i] + len(drafts[i]) + 1)
        ]
        block = logits[rows]
        params = [reqs[i].sampling_params for i in drafted for _ in range(len(drafts[i]) + 1)]
        mask = self._verify_grammar_mask(reqs, drafts, drafted, block.shape[-1])
        raw = all(
            argmax_of_raw_logits(reqs[i].sampling_params, len(reqs[i].output_ids) + j)
            for i in drafted
            for j in range(len(drafts[i]) + 1)
        )
        want_logprobs = any(reqs[i].return_logprob for i in drafted)
        probs = None
        scaled = None
        if mask is None and raw and not want_logprobs:
            argmax = block.argmax(dim=-1).tolist()
        else:
            # Row j of a request sees its output plus drafts 1..j (penalty counts,
            # min_new_tokens), as plain decoding would at that position.
            outputs = [
                reqs[i].output_ids + drafts[i][:j]
                for i in drafted
                for j in range(len(drafts[i]) + 1)
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
                scaled = _scale(processed, info)
        out: list[list[TokenResult]] = []
        offset = 0
        for i in drafted:
            width = len(drafts[i]) + 1
            if reqs[i].sampling_params.is_greedy or probs is None:
                tokens = accept_greedy(argmax[offset : offset + width], drafts[i])
            else:
                tokens = accept_sampled(probs[offset : offset + width], drafts[i])
            if reqs[i].return_logprob:
                assert scaled is not None
                out.append(_with_logprobs(reqs[i], tokens, scaled[offset : offset + len(tokens)]))
            else:
                out.append([TokenResult(t, 0.0) for t in tokens])
            offset += width
        return out

    @staticmethod
    def _verify_grammar_mask(
        reqs: Sequence[Req], drafts: Sequence[list[int]], drafted: list[int], vocab_size: int
    ) -> PackedVocabMask | None:
        """The packed grammar mask of the verify rows (drafted requests' rows, in order); None
        when no drafted request is constrained."""
        if all(reqs[i].grammar is None for i in drafted):
            return None
        bitmask = allocate_bitmask(sum(len(drafts[i]) + 1 for i in drafted), vocab_size)
        masked: list[int] = []
        offset = 0
        for i in drafted:
            matcher = reqs[i].grammar
            if matcher is not None:
                matcher.check_logits_width(vocab_size)
                filled = fill_verify_masks(matcher, drafts[i], bitmask, offset)
                masked.extend(range(offset, offset + filled))
            offset += len(drafts[i]) + 1
        return PackedVocabMask(bitmask, tuple(masked), vocab_size)

    def _build_inputs(
        self, reqs: Sequence[Req], drafts: Sequence[list[int]]
    ) -> tuple[StepInputs, list[int]]:
        """Flatten the round; first_rows[i] is request i's first logits row (all its rows
        are consecutive, one per verified position)."""
        pool = self.step_runner.kv.req_to_token_pool
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[torch.Tensor] = []
        first_rows: list[int] = []
        extend_lens: list[int] = []
        for req, draft in zip(reqs, drafts, strict=True):
            n = 1 + len(draft)
            first_rows.append(len(input_ids))
            input_ids.append(req.fill_ids[-1])
            input_ids.extend(draft)
            positions.extend(range(req.kv_len, req.kv_len + n))
            slots.append(pool.read(req.req_pool_idx, req.kv_len, req.kv_len + n))
            extend_lens.append(n)
        step = StepInputs(
            is_decode=all(n == 1 for n in extend_lens),
            input_ids=input_ids,
            positions=positions,
            req_pool_indices=[r.req_pool_idx for r in reqs],
            prefix_lens=[r.kv_len for r in reqs],
            extend_lens=extend_lens,
            out_cache_loc=torch.cat(slots),
            logits_rows=list(range(len(input_ids))),
            # Each request's rows run under its adapter (a draft model proposes from its base
            # weights; the target's verification keeps the output exact either way).
            lora_ids=tuple(r.lora_id for r in reqs) if self.step_runner.runner.lora else (),
        )
        return step, first_rows


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
    return results
