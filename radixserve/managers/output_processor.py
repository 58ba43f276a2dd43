"""A step's results applied to its requests, and every output the scheduler sends.

Tokens go through the grammar and the finish checks (EOS, stop ids and strings, length); a
speculative round's tokens are appended one by one and the KV of positions not kept is trimmed.
Finished requests release their KV (computed KV enters the radix cache) and leave exactly one
final output; streaming requests get partial outputs every --stream-interval tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from radixserve.managers.request_stats import log_time_stats
from radixserve.messages import DetokParams, FinishReason, ReqOutput
from radixserve.sampling.token_result import EmbeddingResult

if TYPE_CHECKING:
    from radixserve.managers.decode_logger import DecodeLogger
    from radixserve.managers.finish_checker import FinishChecker
    from radixserve.managers.kv_manager import KVManager
    from radixserve.managers.request_queues import RequestQueues
    from radixserve.managers.retraction import NewTokenRatio
    from radixserve.managers.schedule_batch import Req, ScheduledBatch, SchedulerStats
    from radixserve.managers.sessions import SessionController
    from radixserve.managers.step_runner import StepResult
    from radixserve.sampling.token_result import TokenResult
    from radixserve.speculative.draft_tree import DraftTree
    from radixserve.speculative.worker import SpecWorker


class OutputProcessor:
    def __init__(
        self,
        queues: RequestQueues,
        kv: KVManager,
        finish_checker: FinishChecker,
        sessions: SessionController,
        stats: SchedulerStats,
        ratio: NewTokenRatio,
        decode_log: DecodeLogger,
        spec: SpecWorker | None,
        *,
        radix_enabled: bool,
        stream_interval: int,
        log_time_stats: bool,
        hold: Callable[[Req, FinishReason], bool] | None = None,
    ) -> None:
        self.queues = queues
        self.kv = kv
        self.finish_checker = finish_checker
        self.sessions = sessions
        self.stats = stats
        self.ratio = ratio
        self.decode_log = decode_log
        self.spec = spec
        self.radix_enabled = radix_enabled
        self.stream_interval = stream_interval
        self.log_time_stats = log_time_stats
        # Takes a finished request's KV instead of releasing it, when it returns True (a PD
        # prefill keeps it for the decode server); refused requests pass through it too.
        self.hold = hold
        self.stream_reqs: set[str] = set()  # rids of streaming requests still live
        self.pending_outputs: list[ReqOutput] = []  # sent by the loop after each step

    def take_outputs(self) -> list[ReqOutput]:
        outputs, self.pending_outputs = self.pending_outputs, []
        return outputs

    def process(self, batch: ScheduledBatch, results: Sequence[StepResult]) -> None:
        if batch.decode_round:
            self.ratio.decay()
            self.decode_log.step(len(batch.reqs))
        else:
            self.stats.prefill_tokens += sum(batch.extend_lens[: batch.num_prefill_reqs])
        still_running: list[Req] = []
        prefill_ids = {id(r) for r in batch.reqs[: batch.num_prefill_reqs]}
        for i, (req, extend_len, result) in enumerate(
            zip(batch.reqs, batch.extend_lens, results, strict=True)
        ):
            req.kv_len += extend_len
            if req.finished:  # aborted while in flight
                continue
            if self.radix_enabled and id(req) in prefill_ids and not req.is_embedding:
                self.kv.cache_unfinished(req)
            if result is None:  # a chunk of a longer prompt; no token yet
                continue
            if isinstance(result, EmbeddingResult):
                result.apply(req)
                self.finish(req, FinishReason("length"))
                continue
            if req.max_new_tokens == 0:  # prefill only (e.g. warming the prefix cache)
                self.finish(req, FinishReason("length"))
                continue
            if req.custom_logit_error is not None:
                self.finish(
                    req, FinishReason("abort", message=req.custom_logit_error, status_code=500)
                )
                continue
            tree = batch.drafts[i] if batch.drafts is not None else None
            if self.apply_tokens(req, result, tree):
                still_running.append(req)
        q = self.queues
        was_running = {id(r) for r in q.running}
        q.running = [r for r in q.running if not r.finished] + [
            r for r in still_running if id(r) not in was_running
        ]

    def apply_token(self, req: Req, result: TokenResult) -> bool:
        """Append one token (a PD decode server's first token, computed by its prefill
        server); True if the request keeps running."""
        return self.apply_tokens(req, [result], None)

    def apply_tokens(self, req: Req, tokens: Sequence[TokenResult], tree: DraftTree | None) -> bool:
        """Append a step's tokens one by one through the grammar and the finish checks,
        stopping at the first that ends the request; True if the request keeps running (a
        streaming one may get an output). `tree`: the drafts it ran in a speculative round
        (possibly none): the KV of positions not kept is dropped first, and the drafter hears
        how many of its drafts were kept."""
        reason = None
        kept = 0
        for token in tokens:
            if req.grammar is not None and not req.grammar.accept_token(token.token_id):
                reason = grammar_dead_end()  # the token is not kept
                break
            token.apply(req)
            kept += 1
            reason = self.finish_checker.check(req)
            if reason is not None:
                break
        self.stats.generated_tokens += kept
        if tree is not None:
            self._commit_round(req, len(tree), min(kept, len(tokens) - 1))
        if reason is not None:
            self.finish(req, reason)
            return False
        if req.rid in self.stream_reqs:
            self._maybe_stream(req)
        return True

    def _commit_round(self, req: Req, num_drafts: int, accepted: int) -> None:
        """After a speculative round: KV keeps the positions holding the kept tokens' inputs
        (the previous last token and the kept drafts; the newest token's KV is computed next
        round, as in plain decoding), and the round is counted."""
        assert self.spec is not None
        self.kv.trim(req, req.seq_len - 1)
        self.spec.committed(req, num_drafts, accepted)
        req.spec_verify_ct += 1
        req.spec_draft_tokens += num_drafts
        req.spec_accepted_tokens += accepted
        self.stats.spec_verify_rounds += 1
        self.stats.spec_draft_tokens += num_drafts
        self.stats.spec_accepted_tokens += accepted

    def _maybe_stream(self, req: Req) -> None:
        interval = req.sampling_params.stream_interval or self.stream_interval or 1
        if len(req.output_ids) - req.sent_offset >= interval:
            self.pending_outputs.append(self.output(req))

    def finish(self, req: Req, reason: FinishReason) -> None:
        """End a request: free its KV, close its session turn, send its final output."""
        req.finished_reason = reason
        computed = req.kv_len
        if self.hold is None or not self.hold(req, reason):
            self.kv.release(req)
        if req.session_id is not None:
            self.sessions.on_finish(req, computed)
        if self.log_time_stats:
            log_time_stats(req)
        self.stream_reqs.discard(req.rid)
        self.pending_outputs.append(self.output(req))

    def refuse(self, req: Req, message: str) -> None:
        """End a request the server will not run (the client's fault: a 400 with `message`)
        before it computed anything."""
        reason = FinishReason("abort", message=message, status_code=400)
        if self.hold is not None:
            self.hold(req, reason)  # a PD prefill tells its decode server
        self.end_unrun(req, reason)
        self.sessions.on_finish(req, 0)

    def end_unrun(self, req: Req, reason: FinishReason) -> None:
        """Send the final output of a request whose KV is not (or no longer) tracked."""
        self.stream_reqs.discard(req.rid)
        req.finished_reason = reason
        self.pending_outputs.append(self.output(req))

    def output(self, req: Req) -> ReqOutput:
        """What the request produced since its last output (all of it the first time)."""
        start = req.sent_offset
        req.sent_offset = len(req.output_ids)
        detok = None
        if start == 0:
            params = req.sampling_params
            detok = DetokParams(
                skip_special_tokens=params.skip_special_tokens,
                spaces_between_special_tokens=params.spaces_between_special_tokens,
                stop_strings=tuple(params.stop or ()),
                no_stop_trim=params.no_stop_trim,
            )
        return ReqOutput(
            detok=detok,
            rid=req.rid,
            new_token_ids=req.output_ids[start:],
            finished=req.finished_reason,
            prompt_tokens=len(req.origin_input_ids),
            completion_tokens=len(req.output_ids),
            cached_tokens=req.cached_tokens,
            cached_tokens_details=req.cached_tokens_details,
            num_retractions=req.num_retractions,
            spec_verify_ct=req.spec_verify_ct if self.spec is not None else None,
            spec_accepted_tokens=req.spec_accepted_tokens,
            spec_draft_tokens=req.spec_draft_tokens,
            embedding=req.embedding,
            output_token_logprobs=req.output_token_logprobs[start:],
            output_top_logprobs=req.output_top_logprobs[start:],
            output_token_ids_logprobs=req.output_token_ids_logprobs[start:],
            input_token_logprobs=req.input_token_logprobs if start == 0 else [],
            input_top_logprobs=req.input_top_logprobs if start == 0 else [],
            input_token_ids_logprobs=req.input_token_ids_logprobs if start == 0 else [],
            routed_experts=_take_routed_experts(req),
        )


def _take_routed_experts(req: Req) -> str | None:
    """A finished request's routed experts, encoded once; its record is freed here (finished
    and aborted requests alike pass through output)."""
    if req.finished_reason is None or not req.return_routed_experts:
        return None
    record, req.routed_experts = req.routed_experts, None
    if record is None:
        return None
    # The tokens that ran: the prompt and the output but its last token. A speculative round
    # that finished inside its accepted drafts (a stop string) ran, and recorded, positions
    # past them.
    ran = len(req.origin_input_ids) + max(len(req.output_ids) - 1, 0)
    return record.encode(req.routed_experts_start_len, end=ran)


def grammar_dead_end() -> FinishReason:
    """The sampler only draws tokens the grammar's mask allows, so a token the matcher refuses
    means the mask allowed none: the grammar cannot go on with this vocabulary (e.g. it needs
    a character no token contains). The client's grammar, so a 400; the token is not kept."""
    return FinishReason(
        "abort",
        message="The grammar allows no further token of this model's vocabulary here (it needs "
        "text no token can produce); generation stopped.",
        status_code=400,
    )
