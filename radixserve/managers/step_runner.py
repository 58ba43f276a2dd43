"""Turns a ScheduledBatch into model inputs, runs the model, samples and verifies.

Every step goes through here: prefill, chunked prefill, decode, mixed batches and speculative
rounds (a decode batch whose requests carry draft trees). The batch's request state becomes
StepInputs in one builder (a request's draft tree through model_executor/verify_inputs.py),
the model runs once, and its logits become per-request results: the tokens to append (one for
plain decoding; 1..depth+1 for a request with drafts, accepted by speculative/verify.py), an
embedding, or None for a prompt chunk that does not reach the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from radixserve.kernels import ops
from radixserve.managers.grammar_manager import GrammarManager
from radixserve.managers.routed_experts import keep_routed_experts
from radixserve.model_executor.step_builder import LogitsWanted, StepBuilder
from radixserve.model_executor.step_io import StepInputs
from radixserve.model_executor.verify_inputs import RoundTable, TreeNodes, add_tree
from radixserve.multimodal.image_items import ImageChunk, image_chunks
from radixserve.sampling.custom_logit_processor import apply_processors
from radixserve.sampling.output_counts import OutputTokenCounts, batch_token_counts
from radixserve.sampling.sampler import Sampler
from radixserve.sampling.sampling_batch_info import SamplingBatchInfo
from radixserve.sampling.token_result import EmbeddingResult, TokenResult
from radixserve.speculative.verify import verify_drafts

if TYPE_CHECKING:
    from radixserve.managers.kv_manager import KVManager
    from radixserve.managers.schedule_batch import Req, ScheduledBatch
    from radixserve.model_executor.model_runner import ModelRunner
    from radixserve.speculative.target import FeatureHook


# sample_pos values at or below this mark an embedding request (its index into hidden_rows is
# EMBED_POS_BASE - value); -1 means "no result this step"; >= 0 is a logits row to sample.
EMBED_POS_BASE = -2

# One request's result of a step: the tokens to append in order (one for plain decoding), its
# embedding, or None (a prompt chunk that does not reach the end yet).
StepResult = list[TokenResult] | EmbeddingResult | None


class StepRunner:
    def __init__(self, runner: ModelRunner, kv: KVManager, eos_token_ids: Sequence[int]) -> None:
        self.runner = runner
        self.kv = kv
        self.eos_token_ids = list(eos_token_ids)
        self.argmax = ops.argmax_rows  # greedy rows (drafters and verification take it too)
        self.sampler = Sampler(argmax=self.argmax)
        # EAGLE speculation: called with each forward's per-token features (the batch's
        # requests, their first positions and token counts, the features); after a verify
        # forward, only the verified positions' (the last token and the accepted drafts).
        self.on_features: FeatureHook | None = None

    def run(self, batch: ScheduledBatch) -> list[StepResult]:
        plan = self._build_inputs(batch)
        step = plan.step
        output = self.runner.forward(step, plan.table)
        _drop_finished_features(step.image_chunks)
        if output.routed_experts is not None and not plan.trees:
            keep_routed_experts(
                batch.reqs, step.prefix_lens, step.extend_lens, output.routed_experts
            )
        results: list[StepResult] = [None] * len(batch.reqs)
        if output.hidden is not None:
            self._embeddings(plan, output.hidden, results)
        logits = output.logits
        if logits is None:
            # argmax_only: the model answered with each row's argmax (no logprobs, drafts or
            # input rows were asked for).
            assert output.greedy_tokens is not None and not plan.trees and not plan.input_rows
            ids = output.greedy_tokens.tolist()
            for i, pos in enumerate(plan.sample_pos):
                if pos >= 0:
                    results[i] = [TokenResult(ids[pos], 0.0)]
        for i, rows in plan.input_rows.items():
            assert logits is not None
            self._input_logprobs(batch.reqs[i], batch.extend_lens[i], logits, rows)
        if plan.trees:
            # Verified before the plain rows are sampled (sampling may work on the logits in
            # place); verification reads its rows through a copy.
            assert logits is not None
            self._verify(batch, plan, logits, results)
        if output.routed_experts is not None and plan.trees:
            # A verify's rows hold drafts that were not kept: only the verified positions'.
            index, lengths = plan.kept_rows(batch.extend_lens)
            keep_routed_experts(
                batch.reqs, [r.kv_len for r in batch.reqs], lengths, output.routed_experts[index]
            )
        if output.features is not None and self.on_features is not None:
            self._hand_features(batch, plan, output.features)
        if logits is not None:
            self._sample_plain(batch, plan.sample_pos, logits, results, plan.step.argmax_only)
        return results

    def _embeddings(self, plan: StepPlan, hidden: torch.Tensor, results: list[StepResult]) -> None:
        """Embeddings: the last token's final hidden state, L2-normalised (SGLang's LAST
        pooling with normalize=True)."""
        vectors = torch.nn.functional.normalize(hidden, dim=-1).tolist()
        for i, pos in enumerate(plan.sample_pos):
            if pos <= EMBED_POS_BASE:
                results[i] = EmbeddingResult(vectors[EMBED_POS_BASE - pos])

    def _sample_plain(
        self,
        batch: ScheduledBatch,
        sample_pos: list[int],
        logits: torch.Tensor,
        results: list[StepResult],
        argmax_only: bool,
    ) -> None:
        """One token for each request with a logits row to sample (sample_pos >= 0);
        `argmax_only`: the step was built knowing every row is plain greedy."""
        sampled_reqs = [r for r, pos in zip(batch.reqs, sample_pos, strict=True) if pos >= 0]
        if not sampled_reqs:
            return
        row_list = [p for p in sample_pos if p >= 0]
        if any(r.custom_logit_processor is not None for r in sampled_reqs):
            apply_processors(logits, row_list, sampled_reqs)
        if row_list != list(range(logits.shape[0])):
            # (A decode step samples every row in order: no [B, V] copy then.)
            logits = logits[torch.tensor(row_list, device=logits.device)]
        samples = iter(self.sample(sampled_reqs, logits, plain_greedy=argmax_only or None))
        for i, pos in enumerate(sample_pos):
            if pos >= 0:
                results[i] = [next(samples)]

    def _verify(
        self,
        batch: ScheduledBatch,
        plan: StepPlan,
        logits: torch.Tensor,
        results: list[StepResult],
    ) -> None:
        """The requests with drafts: what the target accepts (speculative/verify.py), and the
        KV of an accepted branch the tree put elsewhere copied to the positions kv_len + 1,
        kv_len + 2, ... it belongs to."""
        assert batch.drafts is not None
        drafted = list(plan.trees)
        verified = verify_drafts(
            [batch.reqs[i] for i in drafted],
            [batch.drafts[i] for i in drafted],
            logits,
            [plan.trees[i].rows for i in drafted],
            self.eos_token_ids,
            self.argmax,
        )
        moves: list[tuple[int, int]] = []
        for i, v in zip(drafted, verified, strict=True):
            results[i] = v.tokens
            plan.accepted[i] = v.path
            slots = plan.trees[i].slots
            moves.extend((slots[n], slots[d]) for d, n in enumerate(v.path, 1) if n != d)
        if moves:
            src, dst = zip(*moves, strict=True)
            self.runner.copy_kv_slots(
                torch.tensor(src, dtype=torch.int64), torch.tensor(dst, dtype=torch.int64)
            )

    def _hand_features(self, batch: ScheduledBatch, plan: StepPlan, features: torch.Tensor) -> None:
        """EAGLE: the target's features of every new token; of a request with drafts, only
        the verified positions' (the last token and the accepted drafts, known once verified)."""
        assert self.on_features is not None
        if not plan.trees:  # one extend per request, in order
            self.on_features(batch.reqs, plan.step.prefix_lens, plan.step.extend_lens, features)
            return
        index, lengths = plan.kept_rows(batch.extend_lens)
        self.on_features(
            batch.reqs,
            [req.kv_len for req in batch.reqs],
            lengths,
            features[index.to(features.device)],
        )

    def sample(
        self, reqs: Sequence[Req], logits: torch.Tensor, plain_greedy: bool | None = None
    ) -> list[TokenResult]:
        """One token per request from its logits row (row i belongs to reqs[i]).
        `plain_greedy`: whether every request is (_plain_greedy), where the caller knows."""
        if plain_greedy if plain_greedy is not None else _plain_greedy(reqs):
            # The common serving case: argmax, no per-step sampling tensors to build.
            return [TokenResult(t, 0.0) for t in ops.argmax_rows(logits).tolist()]
        info = SamplingBatchInfo.from_requests(
            [r.sampling_params for r in reqs],
            [r.output_ids for r in reqs],
            vocab_size=logits.shape[-1],
            device=logits.device,
            eos_token_ids=self.eos_token_ids,
            grammar_mask=GrammarManager.grammar_mask(reqs, logits.shape[-1]),
            token_counts=_output_counts(reqs, logits.shape[-1], logits.device),
        )
        top_n = max((r.top_logprobs_num for r in reqs if r.return_logprob), default=0)
        need_logprobs = any(r.return_logprob for r in reqs)
        out = self.sampler(logits, info, top_logprobs_num=top_n, need_logprobs=need_logprobs)
        ids = out.next_token_ids.tolist()
        lps = out.logprobs.tolist()
        results: list[TokenResult] = []
        for j, req in enumerate(reqs):
            res = TokenResult(ids[j], lps[j])
            if req.return_logprob and req.top_logprobs_num and out.top_logprobs is not None:
                vals, tids = out.top_logprobs
                k = req.top_logprobs_num
                res.top_logprobs = list(
                    zip(vals[j, :k].tolist(), tids[j, :k].tolist(), strict=True)
                )
            results.append(res)
        wanted = [j for j, r in enumerate(reqs) if r.return_logprob and r.token_ids_logprob]
        if wanted:
            # Only when some request asks: the [B, V] log-softmax of the processed,
            # temperature-scaled logits the chosen token's logprob comes from, read at each
            # request's own ids.
            source = out.scaled if out.scaled is not None else logits
            full = torch.log_softmax(source.float(), dim=-1)
            for j in wanted:
                ids_j = list(reqs[j].token_ids_logprob or ())
                vals_j = full[j, ids_j].tolist()
                results[j].ids_logprobs = list(zip(vals_j, ids_j, strict=True))
        return results

    def _build_inputs(self, batch: ScheduledBatch) -> StepPlan:
        """Flatten the batch: one extend per request, or a request's draft tree
        (verify_inputs.add_tree). sample_pos[i] is the logits row to sample request i from
        (-1 for a chunk that does not reach the end, or for a request with drafts: verified
        instead); input_rows maps request index -> logits rows of all its new tokens, for
        prompt logprobs."""
        builder = StepBuilder(with_lora=self.runner.lora is not None)
        table = RoundTable(self.kv.req_to_token_pool.req_to_token, batch.drafts)
        plan = StepPlan()
        if batch.decode_round and batch.drafts is None and all(r.mrope is None for r in batch.reqs):
            return self._build_decode(batch, builder, table, plan)
        images: list[ImageChunk] = []
        for i, (req, n) in enumerate(zip(batch.reqs, batch.extend_lens, strict=True)):
            row = _row(req)
            plan.starts.append(len(builder.input_ids))
            tree = batch.drafts[i] if batch.drafts is not None else None
            if tree:  # every node's logits, verified after the forward
                plan.trees[i] = add_tree(
                    builder, table, row, req.kv_len, req.last_token, tree, req.lora_id
                )
                plan.sample_pos.append(-1)
                continue
            end = req.kv_len + n
            reaches_end = end == req.seq_len
            prompt_logprobs = (
                req.needs_input_logprobs() and not batch.decode_round and not req.output_ids
            )
            if req.is_embedding:
                wanted: LogitsWanted = "none"
            elif prompt_logprobs:
                wanted = "all"
            else:
                wanted = "last" if reaches_end else "none"
            first_logit = len(builder.logits_rows)
            start = builder.add(
                table.row(row, end),
                req.kv_len,
                req.fill_slice(req.kv_len, end),
                lora_id=req.lora_id,
                logits=wanted,
                mrope_positions=None if req.mrope is None else req.mrope.take(req.kv_len, n),
            )
            if req.images and not batch.decode_round:
                images.extend(image_chunks(req.images, start, req.kv_len, n))
            if req.is_embedding:
                # Encoded as <= EMBED_POS_BASE: an index into the step's hidden rows.
                at = builder.want_hidden(start + n - 1) if reaches_end else None
                plan.sample_pos.append(-1 if at is None else EMBED_POS_BASE - at)
                continue
            if prompt_logprobs:
                plan.input_rows[i] = list(range(first_logit, first_logit + n))
            plan.sample_pos.append(len(builder.logits_rows) - 1 if reaches_end else -1)
        plan.table = table.build()
        plan.step = builder.build(
            slot_table=plan.table,
            # The decode kernels (and compiled graphs) only when every request runs one token
            # on its own table row.
            is_decode=batch.decode_round and all(n == 1 for n in builder.extend_lens),
            capture_routing=any(r.return_routed_experts for r in batch.reqs),
            image_chunks=tuple(images),
            argmax_only=not plan.trees and not plan.input_rows and _argmax_only(batch.reqs),
        )
        return plan

    def _build_decode(
        self, batch: ScheduledBatch, builder: StepBuilder, table: RoundTable, plan: StepPlan
    ) -> StepPlan:
        """_build_inputs for a decode round without drafts or M-RoPE: every request runs its
        last token (kv_len = seq_len - 1) and samples from its row, in order; no images,
        embeddings or prompt logprobs happen in a decode round."""
        reqs = batch.reqs
        kv_lens = [r.kv_len for r in reqs]
        builder.add_decode(
            [_row(r) for r in reqs],
            kv_lens,
            [r.last_token for r in reqs],
            [r.lora_id for r in reqs],
        )
        plan.starts = list(range(len(reqs)))
        plan.sample_pos = list(range(len(reqs)))
        plan.table = table.build()
        plan.step = builder.build(
            slot_table=plan.table,
            is_decode=True,
            capture_routing=any(r.return_routed_experts for r in reqs),
            argmax_only=_argmax_only(reqs),
        )
        return plan

    def _input_logprobs(self, req: Req, n: int, logits: torch.Tensor, rows: list[int]) -> None:
        """Logprob of each prompt token given the tokens before it, from logprob_start_len on.
        The first prompt token has no logprob (None), as in SGLang."""
        prompt = req.origin_input_ids
        first_pos = req.kv_len
        logprobs = torch.log_softmax(logits[rows].float(), dim=-1)
        k = req.top_logprobs_num
        named = list(req.token_ids_logprob or ()) if req.return_logprob else []
        for offset in range(n):
            pos = first_pos + offset  # this row predicts prompt[pos + 1]
            target = pos + 1
            if target >= len(prompt) or target < req.logprob_start_len:
                continue
            token = prompt[target]
            req.input_token_logprobs.append((float(logprobs[offset, token]), token))
            if k:
                vals, ids = torch.topk(logprobs[offset], k)
                req.input_top_logprobs.append(list(zip(vals.tolist(), ids.tolist(), strict=True)))
            if named:
                named_vals = logprobs[offset, named].tolist()
                req.input_token_ids_logprobs.append(list(zip(named_vals, named, strict=True)))
        if req.logprob_start_len == 0 and first_pos == 0:
            req.input_token_logprobs.insert(0, (None, prompt[0]))
            if k:
                req.input_top_logprobs.insert(0, None)
            if named:
                req.input_token_ids_logprobs.insert(0, None)


class StepPlan:
    """A batch's step as built: its inputs and table, and where each request's rows went."""

    step: StepInputs
    table: torch.Tensor

    def __init__(self) -> None:
        self.sample_pos: list[int] = []
        self.input_rows: dict[int, list[int]] = {}
        self.starts: list[int] = []  # each request's first flattened token
        self.trees: dict[int, TreeNodes] = {}  # requests with drafts: their nodes' rows, slots
        self.accepted: dict[int, list[int]] = {}  # once verified: the accepted draft nodes

    def kept_rows(self, extend_lens: Sequence[int]) -> tuple[torch.Tensor, list[int]]:
        """After verification: the flattened rows of the positions each request keeps, in
        request order (all of a request's new tokens; of one with drafts, its last token and
        the accepted drafts), and how many each request has."""
        index: list[int] = []
        lengths: list[int] = []
        for i, n in enumerate(extend_lens):
            nodes = self.trees.get(i)
            if nodes is None:
                index.extend(range(self.starts[i], self.starts[i] + n))
                lengths.append(n)
            else:
                kept = [0, *self.accepted[i]]
                index.extend(nodes.rows[k] for k in kept)
                lengths.append(len(kept))
        return torch.tensor(index, dtype=torch.int64), lengths


def _row(req: Req) -> int:
    assert req.req_pool_idx is not None, f"request {req.rid} runs without a table row"
    return req.req_pool_idx


def _drop_finished_features(chunks: Sequence[ImageChunk]) -> None:
    """Features are needed only until every placeholder token of their image has run; a
    retracted request computes them again."""
    for chunk in chunks:
        if chunk.completes_image:
            chunk.image.features = None


def _plain_greedy(reqs: Sequence[Req]) -> bool:
    """Greedy, without logprobs, grammar, penalties, logit bias or a pending min_new_tokens:
    the next token is the argmax of the raw logits."""
    return all(
        not req.return_logprob
        and req.grammar is None
        and req.sampling_params.samples_raw_argmax(len(req.output_ids))
        for req in reqs
    )


def _argmax_only(reqs: Sequence[Req]) -> bool:
    """Whether every logits row of the step is only argmax'ed: plain greedy requests without
    custom logit processors (the sampler takes the argmax of the logits as they come)."""
    return _plain_greedy(reqs) and all(r.custom_logit_processor is None for r in reqs)


def _output_counts(
    reqs: Sequence[Req], vocab_size: int, device: torch.device
) -> torch.Tensor | None:
    """The batch's output-token counts from each penalised request's incremental counter
    (made on its first penalised step); None when no request has a penalty."""
    trackers = [
        _output_counter(r, vocab_size) if r.sampling_params.has_penalty else None for r in reqs
    ]
    if all(t is None for t in trackers):
        return None
    return batch_token_counts(trackers, [r.output_ids for r in reqs], vocab_size, device)


def _output_counter(req: Req, vocab_size: int) -> OutputTokenCounts:
    if req.output_counts is None or req.output_counts.vocab_size != vocab_size:
        req.output_counts = OutputTokenCounts(vocab_size)
    return req.output_counts
