"""The scheduler: a loop over components built here and handed what they need.

One `step()` is schedule -> run -> process results:
- RequestIntake (request_intake.py) turns a message into a Req or a refusal;
- RequestQueues (request_queues.py) is the request table: waiting, running, the chunked prompt;
- BatchFormer (batch_former.py) picks each step's batch (prefill first, decode retracting
  when the KV pool is short, mixed chunks; a speculative round is a decode batch whose
  requests carry the drafts SpecWorker proposed);
- StepRunner runs every batch (samples, and verifies where there are drafts); OutputProcessor
  (output_processor.py) applies the results, finishes requests and holds the outputs the loop
  sends.
Grammar compiles and image processing run off this thread (GrammarManager, ImageIntake);
runtime controls (pause, sessions, time limits, weights) act on the same components.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from radixserve.errors import InvalidRequestError
from radixserve.layers.moe import expert_record
from radixserve.managers.batch_former import BatchFormer, BatchLimits
from radixserve.managers.crash_dump import CrashDumper
from radixserve.managers.decode_logger import DecodeLogger
from radixserve.managers.disagg_setup import make_disagg
from radixserve.managers.finish_checker import FinishChecker
from radixserve.managers.grammar_backend import make_grammar_backend
from radixserve.managers.grammar_manager import GrammarManager
from radixserve.managers.image_intake import ImageIntake, image_preprocessor
from radixserve.managers.kv_manager import KVManager
from radixserve.managers.lora_scheduling import LoRAScheduling
from radixserve.managers.output_processor import OutputProcessor
from radixserve.managers.request_intake import IntakeLimits, RequestIntake
from radixserve.managers.request_queues import RequestQueues
from radixserve.managers.retraction import NewTokenRatio
from radixserve.managers.runtime_control import (
    Preemption,
    TimeLimits,
    check_pause_mode,
)
from radixserve.managers.schedule_batch import Req, SchedulerStats
from radixserve.managers.schedule_policy import PolicyConfig, SchedulePolicy
from radixserve.managers.scheduler_info import eplb_fields, load_fields, spec_fields, tier_fields
from radixserve.managers.scheduler_tokenizer import full_tokenizer
from radixserve.managers.sessions import SessionController
from radixserve.managers.step_runner import StepRunner
from radixserve.managers.weight_control import WeightControl
from radixserve.mem_cache.allocator import TokenToKVPoolAllocator
from radixserve.mem_cache.chunk_cache import ChunkCache
from radixserve.mem_cache.hicache.setup import make_hicache
from radixserve.mem_cache.radix_cache import RadixCache
from radixserve.mem_cache.req_to_token_pool import ReqToTokenPool
from radixserve.messages import (
    AbortReq,
    FinishReason,
    ReqOutput,
    TokenizedGenerateReq,
)
from radixserve.speculative.config import SpecConfig
from radixserve.speculative.worker import SpecWorker

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
        if spec and getattr(runner.model, "image_layout", None) == "grid":
            # Speculative steps rotate by 1-D positions; an M-RoPE request's differ.
            raise ValueError(
                f"--speculative-algorithm is not supported with {cfg.model_type} (M-RoPE "
                "positions); leave it unset"
            )
        self.spec = SpecWorker(spec, self.step_runner, self.context_len) if spec else None
        if self.spec is not None and server_args.enable_mixed_chunk:
            logger.info("--enable-mixed-chunk is off with speculative decoding (as in SGLang)")
        self.grammars = GrammarManager(
            lambda: make_grammar_backend(
                server_args, full_tokenizer(tokenizer), cfg.vocab_size, eos
            )
        )
        self.ratio = NewTokenRatio(server_args.schedule_conservativeness)
        self.queues = RequestQueues()
        # A vision model's image processing, off this thread (a text-only model refuses images).
        self.image_intake = ImageIntake(image_preprocessor(runner))
        self.in_flight: list[Req] = []  # the batch being run, for fail_all
        self.check_kv_each_step = False
        self.stats = SchedulerStats()
        # Runtime controls (runtime_control.py, sessions.py).
        self.paused = False
        self.time_limits = TimeLimits.from_env()
        bos = getattr(tokenizer, "bos_token_id", None) if tokenizer is not None else None
        self.sessions = SessionController(self.kv, bos)
        # --disaggregation-mode prefill|decode: the role's manager (managers/disagg_*.py). It
        # reads the components below when it runs, not while it is built.
        self.disagg = make_disagg(server_args, self)
        self.intake = RequestIntake(
            IntakeLimits.from_args(server_args, self.context_len, self.kv.allocator.size),
            self.sessions,
            self.lora.has_adapter,
            self.image_intake.refusal,
        )
        self.outputs = OutputProcessor(
            self.queues,
            self.kv,
            self.finish_checker,
            self.sessions,
            self.stats,
            self.ratio,
            DecodeLogger(server_args.decode_log_interval, self.info),
            self.spec,
            radix_enabled=self.radix_enabled,
            stream_interval=server_args.stream_interval,
            log_time_stats=bool(server_args.enable_request_time_stats_logging),
            # A PD prefill keeps a finished request's KV for its decode server.
            hold=self.disagg.hold if self.disagg is not None else None,
        )
        self.former = BatchFormer(
            BatchLimits.from_args(
                server_args,
                runner.model,
                self.context_len,
                self.max_running_requests,
                decode_width=self.spec.tokens_per_request if self.spec else 1,
                speculative=self.spec is not None,
            ),
            self.queues,
            self.kv,
            self.policy,
            self.ratio,
            self.stats,
            self.lora,
            Preemption.from_args(server_args),
            self.spec,
            self.outputs.finish,
        )
        self.weights = WeightControl(self)
        folder = server_args.crash_dump_folder
        self.crash_dumper = CrashDumper(folder) if folder else None

    # The request table and outputs, read by the runtime, load reports and tests.
    @property
    def waiting(self) -> list[Req]:
        return self.queues.waiting

    @property
    def running(self) -> list[Req]:
        return self.queues.running

    @property
    def chunked_req(self) -> Req | None:
        return self.queues.chunked_req

    @property
    def pending_outputs(self) -> list[ReqOutput]:
        return self.outputs.pending_outputs

    @property
    def admit_new(self) -> bool:
        return self.former.admit_new

    @admit_new.setter
    def admit_new(self, value: bool) -> None:
        self.former.admit_new = value

    # -- intake -----------------------------------------------------------------------------
    def add_request(self, msg: TokenizedGenerateReq) -> None:
        if self.crash_dumper is not None:
            self.crash_dumper.record(msg)
        intake = self.intake.build(msg)
        if self.disagg is not None:
            self.disagg.prepare(intake.req)
        for rid in intake.replaced:
            self.abort(AbortReq(rid=rid, message="Replaced in its session."))
        req = intake.req
        if intake.error is not None:
            self.outputs.refuse(req, intake.error)
            return
        if msg.stream:
            self.outputs.stream_reqs.add(req.rid)
        if msg.images:
            self.image_intake.start(req, msg)  # it goes on (_queue) once its images are ready
            return
        self._queue(req)

    def _queue(self, req: Req) -> None:
        """An accepted request joins the waiting queue, or first compiles its grammar."""
        if self.grammars.needs_grammar(req):
            problem = self.grammars.start(req)  # it joins the queue once compiled
            if problem is not None:
                self.outputs.refuse(req, problem)
            return
        self.queues.waiting.append(req)

    def abort(self, msg: AbortReq) -> None:
        if self.disagg is not None:
            self.disagg.abort(msg.rid, msg.abort_all)
        doomed = [r for r in self._live_reqs() if msg.abort_all or r.rid == msg.rid]
        for req in doomed:
            self.outputs.finish(req, FinishReason("abort", message=msg.message))
        self.queues.drop_finished()

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
        self.queues.clear()
        self.in_flight = []
        ended: list[Req] = []
        for req in doomed.values():
            if req.finished:
                continue
            ended.append(req)
            req.req_pool_idx = None
            req.last_node = None
            self.outputs.end_unrun(req, FinishReason("abort", message=message, status_code=500))
        if self.disagg is not None:
            self.disagg.before_hard_reset()  # no KV transfer may touch the pool being reset
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
            self.former.give_back_chunked()
            while self.queues.running:
                self.former.retract(self.queues.running[-1])
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
        q = self.queues
        expired = self.time_limits.expired(q.waiting, q.in_progress())
        for req, message in expired:
            self.outputs.finish(req, FinishReason("abort", message=message, status_code=503))
        if expired:
            q.drop_finished()

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
            **load_fields(self.kv, self.queues),
            **tier_fields(self.kv, stats),
            **(spec_fields(stats) if self.spec is not None else {}),
            **expert_record.info_fields(self.args.expert_distribution_recorder_mode),
            **(self.disagg.info() if self.disagg is not None else {}),
            **eplb_fields(getattr(self.runner, "eplb", None)),
        }

    def step_outputs_only(self) -> list[ReqOutput]:
        return self.outputs.take_outputs()

    # -- the loop ---------------------------------------------------------------------------
    def has_work(self) -> bool:
        if self.paused:  # nothing runs until /continue_generation
            return bool(self.pending_outputs)
        return bool(
            self.queues.batchable()
            or self.pending_outputs
            or self.grammars.compiling
            or self.image_intake.preparing
            or self._disagg_busy()
        )

    def background_only(self) -> bool:
        """Whether the only work is on other threads (grammars compiling, images processing):
        the loop then waits a little for messages instead of spinning on empty steps."""
        return not (self.queues.batchable() or self.pending_outputs)

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
        batch = self.former.schedule()
        if batch is not None:
            for req in batch.reqs:
                if req.first_scheduled_time is None:
                    req.first_scheduled_time = time.monotonic()
            self.in_flight = batch.reqs
            self.outputs.process(batch, self.step_runner.run(batch))
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
            self.outputs.refuse(req, message)

    def _admit_compiled_grammars(self) -> None:
        if not self.grammars.compiling:
            return
        ready, failed = self.grammars.collect_ready()
        self.queues.waiting.extend(ready)
        for req, message in failed:
            self.outputs.refuse(req, message)

    def _disagg_busy(self) -> bool:
        return self.disagg is not None and self.disagg.busy()

    def close(self) -> None:
        """Stop what the scheduler started besides its loop (the PD role's servers)."""
        if self.disagg is not None:
            self.disagg.close()

    def _live_reqs(self) -> list[Req]:
        q = self.queues
        live = [*q.waiting, *q.running, *self.grammars.compiling.reqs()]
        live.extend(self.image_intake.preparing.reqs())
        if q.chunked_req is not None:
            live.append(q.chunked_req)
        return live


def _eos_token_ids(config_eos: Sequence[int], tokenizer: Any) -> list[int]:
    ids = list(config_eos)
    tok_eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    if tok_eos is not None and tok_eos not in ids:
        ids.append(tok_eos)
    return ids
