"""The scheduler: admits requests, builds each step's batch, runs it, and updates requests.

One `step()` is schedule -> run -> process results. Prefill has priority over decode; a decode
step that would not fit in the KV pool first retracts requests (they go back to the queue and
resume from the prefix cache later, with the same output).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from radixserve.errors import InvalidRequestError
from radixserve.layers.moe import expert_record
from radixserve.managers.crash_dump import CrashDumper
from radixserve.managers.decode_logger import DecodeLogger
from radixserve.managers.disagg_setup import make_disagg
from radixserve.managers.finish_checker import FinishChecker
from radixserve.managers.grammar_backend import make_grammar_backend
from radixserve.managers.grammar_manager import GrammarManager
from radixserve.managers.image_intake import ImageIntake, image_preprocessor
from radixserve.managers.kv_manager import KVManager
from radixserve.managers.load_report import load_fields
from radixserve.managers.lora_scheduling import LoRAScheduling
from radixserve.managers.request_stats import log_time_stats
from radixserve.managers.retraction import NewTokenRatio, retraction_order
from radixserve.managers.runtime_control import (
    PRIORITY_DISABLED_MESSAGE,
    Preemption,
    TimeLimits,
    check_pause_mode,
)
from radixserve.managers.schedule_batch import Req, ScheduledBatch, SchedulerStats
from radixserve.managers.schedule_policy import PolicyConfig, PrefillAdder, SchedulePolicy
from radixserve.managers.scheduler_tokenizer import full_tokenizer
from radixserve.managers.sessions import SessionController, SessionError
from radixserve.managers.step_runner import StepRunner
from radixserve.managers.weight_control import WeightControl
from radixserve.mem_cache.allocator import TokenToKVPoolAllocator
from radixserve.mem_cache.chunk_cache import ChunkCache
from radixserve.mem_cache.hicache.setup import make_hicache
from radixserve.mem_cache.radix_cache import RadixCache
from radixserve.mem_cache.req_to_token_pool import ReqToTokenPool
from radixserve.messages import (
    ROUTED_EXPERTS_DISABLED,
    AbortReq,
    DetokParams,
    FinishReason,
    ReqOutput,
    TokenizedGenerateReq,
)
from radixserve.sampling.custom_logit_processor import DISABLED_MESSAGE as CUSTOM_LOGIT_DISABLED
from radixserve.sampling.custom_logit_processor import load_processor
from radixserve.sampling.sampling_params import SamplingParams
from radixserve.speculative.config import SpecConfig
from radixserve.speculative.worker import SpecResult, SpecWorker

if TYPE_CHECKING:
    from radixserve.model_executor.model_runner import ModelRunner
    from radixserve.server_args import ServerArgs

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, server_args: ServerArgs, runner: ModelRunner, tokenizer: Any) -> None:
        self.args = server_args
        self.runner = runner
        self.tokenizer = tokenizer  # None with --skip-tokenizer-init
        cfg = runner.model_config
        self.context_len = cfg.context_len
        self.max_running_requests = runner.plan.max_running_requests
        self.page_size = server_args.page_size
        self.radix_enabled = not server_args.disable_radix_cache
        allocator = TokenToKVPoolAllocator(
            runner.plan.max_total_tokens, server_args.page_size, runner.device
        )
        req_pool = ReqToTokenPool(self.max_running_requests, self.context_len, runner.device)
        cache = (
            RadixCache(server_args.page_size, server_args.radix_eviction_policy)
            if self.radix_enabled
            else ChunkCache(server_args.page_size)
        )
        hicache = make_hicache(server_args, runner.kv_cache) if self.radix_enabled else None
        self.kv = KVManager(allocator, req_pool, cache, hicache)
        self.lora = LoRAScheduling(runner.lora, self._live_reqs)
        self.policy = SchedulePolicy(
            PolicyConfig(
                policy=server_args.schedule_policy,
                enable_priority=server_args.enable_priority_scheduling,
                low_priority_values_first=server_args.schedule_low_priority_values_first,
                radix_enabled=self.radix_enabled,
            )
        )
        eos = _eos_token_ids(cfg.eos_token_ids, tokenizer)
        self.finish_checker = FinishChecker(eos, self.context_len, tokenizer)
        self.step_runner = StepRunner(runner, self.kv, eos)
        spec = SpecConfig.from_args(server_args)
        self.spec = SpecWorker(spec, self.step_runner, self.context_len) if spec else None
        # Slots a running request may take in one decode round.
        self.decode_width = self.spec.tokens_per_request if self.spec else 1
        if self.spec is not None and server_args.enable_mixed_chunk:
            logger.info("--enable-mixed-chunk is off with speculative decoding (as in SGLang)")
        self.grammars = GrammarManager(
            lambda: make_grammar_backend(
                server_args, full_tokenizer(tokenizer), cfg.vocab_size, eos
            )
        )
        self.ratio = NewTokenRatio(server_args.schedule_conservativeness)
        chunk = server_args.chunked_prefill_size
        self.chunk_size = None if chunk is None or chunk <= 0 else chunk
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.chunked_req: Req | None = None
        # A vision model's image processing, off this thread (a text-only model refuses images).
        self.image_intake = ImageIntake(image_preprocessor(runner))
        self.in_flight: list[Req] = []  # the batch being run, for fail_all
        self.stream_reqs: set[str] = set()
        self.pending_outputs: list[ReqOutput] = []
        self.check_kv_each_step = False
        self.default_priority = server_args.default_priority_value or 0
        self.decode_log = DecodeLogger(server_args.decode_log_interval)
        self.stats = SchedulerStats()
        # Runtime controls (runtime_control.py, sessions.py).
        self.paused = False
        self.time_limits = TimeLimits.from_env()
        self.preemption = Preemption.from_args(server_args)
        bos = getattr(tokenizer, "bos_token_id", None) if tokenizer is not None else None
        self.sessions = SessionController(self.kv, bos)
        self.weights = WeightControl(self)
        self.admit_new = True  # False while a weight update waits for started requests
        folder = server_args.crash_dump_folder
        self.crash_dumper = CrashDumper(folder) if folder else None
        self.log_time_stats = bool(server_args.enable_request_time_stats_logging)
        # --disaggregation-mode prefill|decode: the role's manager (managers/disagg_*.py).
        self.disagg = make_disagg(server_args, self)

    # -- intake -----------------------------------------------------------------------------
    def add_request(self, msg: TokenizedGenerateReq) -> None:
        if self.crash_dumper is not None:
            self.crash_dumper.record(msg)
        params = SamplingParams.from_dict(msg.sampling_params)
        if msg.embedding:
            params.max_new_tokens = 0
        input_ids, problem = self._session_input(msg)
        if not msg.embedding and params.max_new_tokens is None:  # up to the context length
            params.max_new_tokens = max(self.context_len - len(input_ids), 0)
        req = Req(
            rid=msg.rid,
            origin_input_ids=input_ids,
            sampling_params=params,
            return_logprob=msg.return_logprob,
            logprob_start_len=msg.logprob_start_len,
            top_logprobs_num=msg.top_logprobs_num,
            token_ids_logprob=msg.token_ids_logprob,
            priority=msg.priority if msg.priority is not None else self.default_priority,
            is_embedding=msg.embedding,
            lora_id=msg.lora_id,
            custom_logit_processor=msg.custom_logit_processor,
            return_routed_experts=msg.return_routed_experts,
            routed_experts_start_len=msg.routed_experts_start_len,
            session_id=(msg.session_params or {}).get("id") if problem is None else None,
            bootstrap=msg.bootstrap,
        )
        if self.disagg is not None:
            self.disagg.prepare(req)
        error = (
            problem
            or self._admission_error(req)
            or self.image_intake.refusal(req, msg)
            or self._processor_error(req)
            or self._routed_experts_error(req)
        )
        args = self.args
        if error is None and msg.priority is not None and not args.enable_priority_scheduling:
            # SGLang ignores the value unless told to refuse it.
            error = PRIORITY_DISABLED_MESSAGE if args.abort_on_priority_when_disabled else None
        if error is not None:
            self._refuse(req, error)
            return
        if msg.stream:
            self.stream_reqs.add(req.rid)
        if msg.images:
            self.image_intake.start(req, msg)  # it goes on (_queue) once its images are ready
            return
        self._queue(req)

    def _queue(self, req: Req) -> None:
        """An accepted request joins the waiting queue, or first compiles its grammar."""
        if self.grammars.needs_grammar(req):
            problem = self.grammars.start(req)  # it joins the queue once compiled
            if problem is not None:
                self._refuse(req, problem)
            return
        self.waiting.append(req)

    def _session_input(self, msg: TokenizedGenerateReq) -> tuple[list[int], str | None]:
        """The request's input ids (a session continuation prepends its saved tokens), or the
        reason its session_params cannot be honoured."""
        if msg.session_params is None:
            return list(msg.input_ids), None
        try:
            ids, cut_off = self.sessions.build_input(msg.rid, msg.session_params, msg.input_ids)
        except SessionError as exc:
            return list(msg.input_ids), str(exc)
        for rid in cut_off:
            self.abort(AbortReq(rid=rid, message="Replaced in its session."))
        return ids, None

    def _routed_experts_error(self, req: Req) -> str | None:
        # TokenizerManager.build_request refuses it first; a message built another way is
        # refused here, so a scheduler without the flag never captures.
        if req.return_routed_experts and not self.args.enable_return_routed_experts:
            return ROUTED_EXPERTS_DISABLED
        return None

    def _processor_error(self, req: Req) -> str | None:
        if req.custom_logit_processor is None:
            return None
        if not self.args.enable_custom_logit_processor:
            return CUSTOM_LOGIT_DISABLED
        try:
            load_processor(req.custom_logit_processor)
        except InvalidRequestError as exc:
            return str(exc)
        return None

    def _admission_error(self, req: Req) -> str | None:
        n = len(req.origin_input_ids)
        if n == 0:
            return "The prompt is empty."
        if req.lora_id and not self.lora.has_adapter(req.lora_id):
            return "The request's LoRA adapter is not loaded (it was unloaded meanwhile)."
        if n >= self.context_len:
            return (
                f"The prompt has {n} tokens, which does not fit the model's context length "
                f"of {self.context_len} tokens."
            )
        if n + req.max_new_tokens > self.context_len:
            return (
                f"Requested token count exceeds the model's maximum context length of "
                f"{self.context_len} tokens: {n} prompt tokens + {req.max_new_tokens} new tokens."
            )
        if n + req.max_new_tokens > self.kv.allocator.size:
            return (
                f"The request needs {n + req.max_new_tokens} KV tokens but the whole KV cache "
                f"holds {self.kv.allocator.size}; raise --max-total-tokens or lower max_new_tokens."
            )
        return None

    def abort(self, msg: AbortReq) -> None:
        if self.disagg is not None:
            self.disagg.abort(msg.rid, msg.abort_all)
        doomed = [r for r in self._live_reqs() if msg.abort_all or r.rid == msg.rid]
        for req in doomed:
            self._finish(req, FinishReason("abort", message=msg.message))
        self.waiting = [r for r in self.waiting if not r.finished]
        self.running = [r for r in self.running if not r.finished]
        if self.chunked_req is not None and self.chunked_req.finished:
            self.chunked_req = None

    def flush_cache(self) -> bool:
        if self._live_reqs() or self.sessions.holds_locks() or self._disagg_busy():
            return False
        return self.kv.flush_cache()

    def radix_tree(self, max_nodes: int) -> dict[str, Any] | None:
        """The dashboard's picture of the prefix tree; None without a radix cache."""
        from radixserve.mem_cache.tree_snapshot import tree_snapshot

        root = getattr(self.kv.prefix_cache, "root", None)
        if root is None:
            return None
        decode = self.tokenizer.decode if self.tokenizer is not None else None
        return tree_snapshot(root, decode, max_nodes)

    def fail_all(self, message: str) -> None:
        """End every live request with an error after a failed step.

        The step may have died half-way (slots allocated but not recorded, a batch admitted but
        not yet running), so instead of releasing request by request, every request in flight
        ends once and the KV bookkeeping starts afresh (the prefix cache is dropped).
        """
        if self.crash_dumper is not None:
            self.crash_dumper.dump(message)
        doomed = {id(r): r for r in self._live_reqs()}
        for req in self.in_flight:
            doomed.setdefault(id(req), req)
        self.waiting, self.running, self.chunked_req, self.in_flight = [], [], None, []
        ended: list[Req] = []
        for req in doomed.values():
            if req.finished:
                continue
            ended.append(req)
            req.finished_reason = FinishReason("abort", message=message, status_code=500)
            req.req_pool_idx = None
            req.last_node = None
            self.stream_reqs.discard(req.rid)
            self.pending_outputs.append(self._output(req))
        self.kv.hard_reset()
        if self.disagg is not None:
            self.disagg.after_hard_reset(message)
        self.sessions.forget_locks()
        for req in ended:
            if req.session_id is not None:
                self.sessions.on_finish(req, 0)  # aborted: nothing to continue from

    # -- runtime controls (SGLang's /pause_generation, sessions, time limits) ----------------
    def pause(self, mode: str) -> None:
        check_pause_mode(mode)
        if mode == "abort":
            self.abort(AbortReq(abort_all=True, message="Aborted by /pause_generation."))
        elif mode == "retract":
            if self.chunked_req is not None:
                req, self.chunked_req = self.chunked_req, None
                self.kv.release(req)
                self.waiting.insert(0, req)
            while self.running:
                self._retract_one(self.running[-1])
        self.paused = True

    def resume(self) -> None:
        if self.weights.released:
            raise InvalidRequestError(
                "Memory is released; /resume_memory_occupation resumes generation."
            )
        self.paused = False

    def live_reqs(self) -> list[Req]:
        return self._live_reqs()

    def drop_prefix_cache(self) -> None:
        """Forget every cached prefix (sessions keep their tokens, not their KV)."""
        self.sessions.unlock_all()
        if not self.kv.flush_cache():
            logger.warning("The prefix cache could not be dropped: requests still hold KV")

    def open_session(self, session_id: str | None, capacity: int | None) -> str:
        return self.sessions.open(session_id, capacity)

    def close_session(self, session_id: str) -> None:
        for rid in self.sessions.close(session_id):
            self.abort(AbortReq(rid=rid, message="Its session was closed."))

    def _expire_timed_out(self) -> None:
        if not self.time_limits.active:
            return
        running = [*self.running, *([self.chunked_req] if self.chunked_req else [])]
        expired = self.time_limits.expired(self.waiting, running)
        for req, message in expired:
            self._finish(req, FinishReason("abort", message=message, status_code=503))
        if expired:
            self.waiting = [r for r in self.waiting if not r.finished]
            self.running = [r for r in self.running if not r.finished]
            if self.chunked_req is not None and self.chunked_req.finished:
                self.chunked_req = None

    def _preempt_for_priority(self) -> None:
        """Retract running requests of much lower priority when the most urgent waiting
        request cannot start otherwise (no request slot, or not enough KV)."""
        head = self.policy.order(self.waiting, self.kv)[0]
        prefix, _ = self.kv.match_prefix(head, update_stats=False)
        need = head.seq_len - len(prefix) + min(head.remaining_new_tokens(), 4096)

        def fits(gone: Sequence[Req]) -> bool:
            gone_ids = {id(r) for r in gone}
            stay = [r for r in self.running if id(r) not in gone_ids]
            reserved = sum(min(r.remaining_new_tokens(), 4096) for r in stay)
            freed = sum(r.kv_len - r.cached_len for r in gone)
            room = self.kv.available_tokens() + freed - int(reserved * self.ratio.value)
            return len(stay) < self.max_running_requests and room >= need

        if fits([]):
            return
        for victim in self.preemption.victims(head, self.running, fits):
            logger.info("Preempting request %s for higher-priority %s", victim.rid, head.rid)
            self._retract_one(victim)

    def info(self) -> dict[str, Any]:
        """Live state for /server_info and metrics."""
        stats = self.stats
        return {
            "num_running_reqs": len(self.running) + int(self.chunked_req is not None),
            "num_waiting_reqs": len(self.waiting),
            "max_total_num_tokens": self.kv.allocator.size,
            "max_running_requests": self.max_running_requests,
            "available_kv_tokens": self.kv.allocator.available_size(),
            "cached_tokens": self.kv.prefix_cache.total_size(),
            "token_usage": 1.0 - self.kv.available_tokens() / self.kv.allocator.size,
            "prompt_tokens_total": stats.prompt_tokens,
            "cached_prompt_tokens_total": stats.cached_prompt_tokens,
            "prefill_tokens_total": stats.prefill_tokens,
            "generation_tokens_total": stats.generated_tokens,
            "num_retractions_total": stats.retractions,
            "cache_hit_rate": stats.cache_hit_rate,
            "paused": self.paused,
            "num_sessions": len(self.sessions.sessions),
            **load_fields(self),
            **self._tier_info(),
            **self._spec_info(),
            **expert_record.info_fields(self.args.expert_distribution_recorder_mode),
            **(self.disagg.info() if self.disagg is not None else {}),
        }

    def _tier_info(self) -> dict[str, Any]:
        """Prompt tokens served per cache tier (device / host / storage)."""
        if self.kv.hicache is None:
            return {}
        stats = self.stats
        lower = stats.cached_host_tokens + stats.cached_storage_tokens
        return {
            "cached_tokens_device_total": stats.cached_prompt_tokens - lower,
            "cached_tokens_host_total": stats.cached_host_tokens,
            "cached_tokens_storage_total": stats.cached_storage_tokens,
            **self.kv.hicache.info(),
        }

    def _spec_info(self) -> dict[str, Any]:
        if self.spec is None:
            return {}
        stats = self.stats
        rounds, accepted = stats.spec_verify_rounds, stats.spec_accepted_tokens
        return {
            "spec_verify_rounds_total": rounds,
            "spec_draft_tokens_total": stats.spec_draft_tokens,
            "spec_accepted_tokens_total": accepted,
            # SGLang's figures: tokens per verify round, and accepted / proposed drafts.
            "spec_accept_length": (rounds + accepted) / rounds if rounds else 0.0,
            "spec_accept_rate": accepted / stats.spec_draft_tokens
            if stats.spec_draft_tokens
            else 0.0,
        }

    def step_outputs_only(self) -> list[ReqOutput]:
        outputs, self.pending_outputs = self.pending_outputs, []
        return outputs

    # -- the loop ---------------------------------------------------------------------------
    def has_work(self) -> bool:
        if self.paused:  # nothing runs until /continue_generation
            return bool(self.pending_outputs)
        return bool(
            self.waiting
            or self.running
            or self.chunked_req
            or self.pending_outputs
            or self.grammars.compiling
            or self.image_intake.preparing
            or self._disagg_busy()
        )

    def background_only(self) -> bool:
        """Whether the only work is on other threads (grammars compiling, images processing):
        the loop then waits a little for messages instead of spinning on empty steps."""
        return not (self.waiting or self.running or self.chunked_req or self.pending_outputs)

    def step(self) -> list[ReqOutput]:
        """Run one step and return every output produced since the last call."""
        self.step_and_stash()
        return self.step_outputs_only()

    def step_and_stash(self) -> None:
        """Run one step (if there is a batch); outputs wait in pending_outputs."""
        self._admit_prepared_images()
        self._admit_compiled_grammars()
        if self.disagg is not None:
            self.disagg.poll()  # rooms released, KV received (managers/disagg_*.py)
        if self.paused:
            return
        self._expire_timed_out()
        batch = self._schedule()
        if batch is not None:
            for req in batch.reqs:
                if req.first_scheduled_time is None:
                    req.first_scheduled_time = time.monotonic()
            self.in_flight = batch.reqs
            if batch.drafts is not None and self.spec is not None:
                results: Sequence[Any] = self.spec.run(batch.reqs, batch.drafts)
            else:
                results = self.step_runner.run(batch)
            self._process(batch, results)
            self.in_flight = []
            if self.check_kv_each_step:
                held = self.disagg.held_reqs() if self.disagg is not None else []
                self.kv.check_conservation([*self._live_reqs(), *held])
        elif not self.running:
            self.ratio.reset()

    def _admit_prepared_images(self) -> None:
        if not self.image_intake.preparing:
            return
        ready, failed = self.image_intake.collect_ready()
        for req in ready:
            self._queue(req)
        for req, message in failed:
            self._refuse(req, message)

    def _admit_compiled_grammars(self) -> None:
        if not self.grammars.compiling:
            return
        ready, failed = self.grammars.collect_ready()
        self.waiting.extend(ready)
        for req, message in failed:
            self._refuse(req, message)

    def _refuse(self, req: Req, message: str) -> None:
        """End a request the server will not run (the client's fault: a 400 with `message`)
        before it computed anything."""
        self.stream_reqs.discard(req.rid)
        req.finished_reason = FinishReason("abort", message=message, status_code=400)
        if self.disagg is not None:
            self.disagg.hold(req, req.finished_reason)  # a PD prefill tells its decode
        self.sessions.on_finish(req, 0)
        self.pending_outputs.append(self._output(req))

    def _disagg_busy(self) -> bool:
        return self.disagg is not None and self.disagg.busy()

    def close(self) -> None:
        """Stop what the scheduler started besides its loop (the PD role's servers)."""
        if self.disagg is not None:
            self.disagg.close()

    def _live_reqs(self) -> list[Req]:
        live = [*self.waiting, *self.running, *self.grammars.compiling.reqs()]
        live.extend(self.image_intake.preparing.reqs())
        if self.chunked_req is not None:
            live.append(self.chunked_req)
        return live

    # -- scheduling -------------------------------------------------------------------------
    def _schedule(self) -> ScheduledBatch | None:
        if self.args.enable_mixed_chunk and self.running and self.spec is None:
            return self._schedule_mixed()
        prefill = self._schedule_prefill()
        if prefill is not None:
            return prefill
        if not self.running:
            return None
        if not self._reserve_decode_slots():
            return None
        if self.spec is not None:
            drafts = self.spec.propose(self.running)
            widths = [1 + len(d) for d in drafts]
            self._alloc_decode_slots(widths)
            return ScheduledBatch(list(self.running), widths, is_decode=True, drafts=drafts)
        self._alloc_decode_slots()
        return ScheduledBatch(list(self.running), [1] * len(self.running), is_decode=True)

    def _schedule_mixed(self) -> ScheduledBatch | None:
        """--enable-mixed-chunk: the running requests' next tokens ride along with a prefill.

        Their slots are reserved (retracting, or giving back the chunked prompt, if needed)
        before the prefill is budgeted, so nothing the prefill admits can be released again
        while the batch is being built; the prefill gets whatever KV is left.
        """
        decoding = self._reserve_decode_slots()
        if decoding:
            self._alloc_decode_slots()
        prefill = self._schedule_prefill()
        if prefill is None:
            if not decoding:
                return None
            return ScheduledBatch(list(self.running), [1] * len(self.running), is_decode=True)
        if decoding:
            prefill.num_prefill_reqs = len(prefill.reqs)
            prefill.reqs.extend(self.running)
            prefill.extend_lens.extend([1] * len(self.running))
        return prefill

    def _alloc_decode_slots(self, widths: Sequence[int] | None = None) -> None:
        if widths is None:
            # Plain decode: one slot per request, allocated for the whole batch at once.
            if self.kv.alloc_decode(self.running) is None:  # _reserve_decode_slots made room
                raise RuntimeError("KV allocation failed for the decode batch after reserving")
            return
        # Speculative rounds take a different number of slots per request.
        for i, req in enumerate(self.running):
            if self.kv.alloc_extend(req, widths[i]) is None:  # _reserve_decode_slots made room
                raise RuntimeError(f"KV allocation failed for request {req.rid} after reserving")

    def _schedule_prefill(self) -> ScheduledBatch | None:
        if not self.waiting and self.chunked_req is None:
            return None
        if self.preemption.enabled and self.running and self.waiting:
            self._preempt_for_priority()
        reserved = sum(min(r.remaining_new_tokens(), 4096) for r in self.running)
        adder = PrefillAdder(
            rem_total_tokens=self.kv.available_tokens() - int(reserved * self.ratio.value),
            rem_input_tokens=self.args.max_prefill_tokens,
            rem_chunk_tokens=self.chunk_size,
            new_token_ratio=self.ratio.value,
            page_size=self.page_size,
        )
        if self.chunked_req is not None:
            req, self.chunked_req = self.chunked_req, None
            if not self._add_admitted(adder, req):
                self.chunked_req = req  # no room this round; keep its KV and retry
                return None
        for req in self.policy.order(self.waiting, self.kv):
            if adder.chunked_req is not None:
                break
            if not self.admit_new and req.first_scheduled_time is None:
                continue  # a weight update waits for the started requests only
            if len(self.running) + len(adder.reqs) >= self.max_running_requests:
                break
            if self.radix_enabled and _shares_uncached_prefix(req, adder.reqs):
                continue  # next round it finds that prefix in the cache
            if req.lora_id and not self.lora.fits_batch(req, [*self.running, *adder.reqs]):
                continue  # --max-loras-per-batch adapters already run; it waits for a slot
            if not self._admit_waiting(adder, req):
                break
        admitted = {id(r) for r in adder.reqs}
        self.waiting = [r for r in self.waiting if id(r) not in admitted]
        self.chunked_req = adder.chunked_req
        if not adder.reqs:
            return None
        return ScheduledBatch(adder.reqs, adder.extend_lens, is_decode=False)

    def _admit_waiting(self, adder: PrefillAdder, req: Req) -> bool:
        prefix, node = self.kv.match_prefix(req)
        if req.needs_input_logprobs():
            # Positions inside a cached prefix get no logits; keep those the client asked for.
            keep = max(req.logprob_start_len - 1, 0) // self.page_size * self.page_size
            prefix = prefix[: min(len(prefix), keep)]
        if req.return_routed_experts:
            # Its ids cover every position from routed_experts_start_len on, and only a
            # forward of this request routes them: the cache may serve the positions before.
            keep = req.routed_experts_start_len // self.page_size * self.page_size
            prefix = prefix[: min(len(prefix), keep)]
        extend_len = req.seq_len - len(prefix)
        if adder.would_reject(req, extend_len):
            return False
        if not self.kv.admit(req, prefix, node):
            return False
        if not req.admitted_once:
            req.cached_tokens = len(prefix)
            req.admitted_once = True
            self.stats.cached_prompt_tokens += len(prefix)
            self.stats.prompt_tokens += len(req.origin_input_ids)
            if self.kv.hicache is not None:
                self._count_tiers(req, len(prefix))
        if self._add_admitted(adder, req):
            return True
        self.kv.release(req)
        return False

    def _count_tiers(self, req: Req, used: int) -> None:
        # The match may have been cut short (input logprobs); the device part comes first.
        hits = self.kv.last_hits
        device = min(hits.device, used)
        host = min(hits.host, used - device)
        storage = used - device - host
        req.cached_tokens_details = {"device": device, "host": host, "storage": storage}
        self.stats.cached_host_tokens += host
        self.stats.cached_storage_tokens += storage

    def _add_admitted(self, adder: PrefillAdder, req: Req) -> bool:
        """Budget and allocate KV for an admitted request's next extend (whole or chunk)."""
        extend_len = req.seq_len - req.kv_len
        take = adder.plan(req, extend_len, self.kv.tokens_needed(req, extend_len))
        if take == 0:
            return False
        if self.kv.alloc_extend(req, take) is None:
            return False
        adder.commit(req, take, self.kv.tokens_needed(req, take), chunked=take < extend_len)
        return True

    def _reserve_decode_slots(self) -> bool:
        """Make sure every running request can take one more token, retracting if needed."""
        while self.running:
            needed = sum(
                self.kv.tokens_needed(r, min(self.decode_width, max(r.remaining_new_tokens(), 1)))
                for r in self.running
            )
            if needed <= self.kv.available_tokens():
                return True
            if self.chunked_req is not None:
                # A half-prefilled prompt is the cheapest thing to give back.
                req, self.chunked_req = self.chunked_req, None
                self.kv.release(req)
                self.waiting.insert(0, req)
                continue
            if len(self.running) == 1:
                self._finish(
                    self.running.pop(),
                    FinishReason(
                        "abort",
                        message="Out of memory even after retracting all other requests.",
                        status_code=500,
                    ),
                )
                return False
            self._retract_one()
        return False

    def _retract_one(self, victim: Req | None = None) -> None:
        if victim is None:
            victim = retraction_order(self.running, self.args.retraction_policy)[0]
        self.running.remove(victim)
        self.kv.release(victim)
        victim.num_retractions += 1
        self.stats.retractions += 1
        self.waiting.insert(0, victim)
        self.ratio.after_retraction(self.running)
        logger.info(
            "Retracted request %s (%d tokens so far); %d still running",
            victim.rid,
            victim.seq_len,
            len(self.running),
        )

    # -- results ----------------------------------------------------------------------------
    def _process(self, batch: ScheduledBatch, results: Sequence[Any]) -> None:
        if batch.is_decode:
            self.ratio.decay()
            self.decode_log.step(self, len(batch.reqs))
        else:
            self.stats.prefill_tokens += sum(batch.extend_lens[: batch.num_prefill_reqs])
        still_running: list[Req] = []
        prefill_ids = {id(r) for r in batch.reqs[: batch.num_prefill_reqs]}
        for req, extend_len, result in zip(batch.reqs, batch.extend_lens, results, strict=True):
            req.kv_len += extend_len
            if req.finished:  # aborted while in flight
                continue
            if self.radix_enabled and id(req) in prefill_ids and not req.is_embedding:
                self.kv.cache_unfinished(req)
            if result is None:  # a chunk of a longer prompt; no token yet
                continue
            if req.is_embedding:
                result.apply(req)
                self._finish(req, FinishReason("length"))
                continue
            if req.max_new_tokens == 0:  # prefill only (e.g. warming the prefix cache)
                self._finish(req, FinishReason("length"))
                continue
            if req.custom_logit_error is not None:
                self._finish(
                    req, FinishReason("abort", message=req.custom_logit_error, status_code=500)
                )
                continue
            if isinstance(result, SpecResult):
                if self._apply_spec(req, result):
                    still_running.append(req)
                continue
            if req.grammar is not None and not req.grammar.accept_token(result.token_id):
                self._finish(req, grammar_dead_end())
                continue
            result.apply(req)
            self.stats.generated_tokens += 1
            reason = self.finish_checker.check(req)
            if reason is not None:
                self._finish(req, reason)
                continue
            still_running.append(req)
            if req.rid in self.stream_reqs:
                self._maybe_stream(req)
        was_running = {id(r) for r in self.running}
        self.running = [r for r in self.running if not r.finished] + [
            r for r in still_running if id(r) not in was_running
        ]

    def _apply_spec(self, req: Req, result: SpecResult) -> bool:
        """Append a speculative round's tokens one by one, stopping at the first that ends the
        request; drop the KV of positions not kept. True if the request keeps running."""
        assert self.spec is not None
        reason = None
        kept = 0
        for token in result.tokens:
            if req.grammar is not None and not req.grammar.accept_token(token.token_id):
                reason = grammar_dead_end()
                break
            token.apply(req)
            kept += 1
            reason = self.finish_checker.check(req)
            if reason is not None:
                break
        # Positions holding the kept tokens' inputs: the previous last token and the kept
        # drafts; the newest token's KV is computed next round, as in plain decoding.
        self.kv.trim(req, req.seq_len - 1)
        accepted = min(kept, result.num_accepted)
        self.spec.committed(req, result.num_drafts, accepted)
        req.spec_verify_ct += 1
        req.spec_draft_tokens += result.num_drafts
        req.spec_accepted_tokens += accepted
        self.stats.spec_verify_rounds += 1
        self.stats.spec_draft_tokens += result.num_drafts
        self.stats.spec_accepted_tokens += accepted
        self.stats.generated_tokens += kept
        if reason is not None:
            self._finish(req, reason)
            return False
        if req.rid in self.stream_reqs:
            self._maybe_stream(req)
        return True

    def _maybe_stream(self, req: Req) -> None:
        interval = req.sampling_params.stream_interval or self.args.stream_interval or 1
        if len(req.output_ids) - req.sent_offset >= interval:
            self.pending_outputs.append(self._output(req))

    def _finish(self, req: Req, reason: FinishReason) -> None:
        req.finished_reason = reason
        computed = req.kv_len
        if self.disagg is None or not self.disagg.hold(req, reason):
            self.kv.release(req)
        if req.session_id is not None:
            self.sessions.on_finish(req, computed)
        if self.log_time_stats:
            log_time_stats(req)
        self.stream_reqs.discard(req.rid)
        self.pending_outputs.append(self._output(req))

    def _output(self, req: Req) -> ReqOutput:
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
    and aborted requests alike pass through _output)."""
    if req.finished_reason is None or not req.return_routed_experts:
        return None
    record, req.routed_experts = req.routed_experts, None
    return record.encode(req.routed_experts_start_len) if record is not None else None


# A waiting request that shares at least this many not-yet-cached prompt tokens with a request
# already in this prefill batch waits one round (SGLang's in-batch prefix caching), so the
# prefix is computed once and cached (cache_unfinished) instead of once per request.
IN_BATCH_PREFIX_TOKENS = 32


def _shares_uncached_prefix(req: Req, admitted: Sequence[Req]) -> bool:
    fill = req.key_ids
    for other in admitted:
        if other.lora_id != req.lora_id:  # another adapter's KV is never shared
            continue
        other_fill = other.key_ids
        if not fill or not other_fill or fill[0] != other_fill[0]:
            continue
        # Shorter prompts (n > 1 copies of one prompt, say) wait when all of theirs is covered.
        need = min(IN_BATCH_PREFIX_TOKENS, len(fill) - 1 - other.cached_len)
        if need > 0 and common_prefix_len(fill, other_fill) - other.cached_len >= need:
            return True
    return False


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix, by binary search over C-level slice compares."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _eos_token_ids(config_eos: Sequence[int], tokenizer: Any) -> list[int]:
    ids = list(config_eos)
    tok_eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    if tok_eos is not None and tok_eos not in ids:
        ids.append(tok_eos)
    return ids


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
