"""The scheduler's event loop, independent of transport: receive messages, run steps, emit
outputs. The in-process engine runs it on a thread over queues; the server runs it in its own
process over ZMQ.

A message or step that raises fails only what it must (the one request, or the batch in
flight, each ending once with an abort) and the loop keeps serving.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from radixserve.errors import InvalidRequestError
from radixserve.messages import (
    AbortReq,
    BatchOutput,
    CloseSessionReq,
    ContinueGenerationReq,
    ControlCall,
    ControlReply,
    ExpertDistributionReq,
    FinishReason,
    FlushCacheReq,
    GetInfoReq,
    GetWeightsByNameReq,
    LoadLoRAReq,
    OpenSessionReq,
    PauseGenerationReq,
    RadixTreeReq,
    ReleaseMemoryReq,
    ReqOutput,
    ResumeMemoryReq,
    TokenizedGenerateReq,
    UnloadLoRAReq,
    UpdateWeightsFromDiskReq,
)
from radixserve.utils.heap import IdleHeapRelease

if TYPE_CHECKING:
    from radixserve.managers.detokenizer_manager import DetokenizerManager
    from radixserve.managers.scheduler import Scheduler

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 0.05
# With only background work (a grammar compiling, images processing), how long the loop waits
# for messages between checks: short against their tens of ms, long enough not to spin.
BACKGROUND_POLL_S = 0.002

Receive = Callable[[float | None], list[Any]]  # timeout (None: do not block) -> messages
Emit = Callable[[Any], None]


class SchedulerLoop:
    def __init__(
        self,
        scheduler: Scheduler,
        receive: Receive,
        emit: Emit,
        detokenizer: DetokenizerManager | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.receive = receive
        self.emit = emit
        self.detokenizer = detokenizer
        self.stop_event = threading.Event()
        # Idle RSS: the model load and each burst of work leave freed memory in the heap.
        self.heap_release = IdleHeapRelease()

    def run(self) -> None:
        while not self.stop_event.is_set():
            if not self.scheduler.has_work():
                timeout: float | None = IDLE_WAIT_S
            elif self.scheduler.background_only():
                timeout = BACKGROUND_POLL_S  # a grammar or an image on its worker thread
            else:
                timeout = None
            for msg in self.receive(timeout):
                self.handle(msg)
            if self.stop_event.is_set():
                break
            busy = self.scheduler.has_work()
            if busy:
                self._step()
            self._flush_outputs()
            self.heap_release.observe(busy)
            if self.scheduler.weights.update_ready():
                self._finish_weight_update()

    def handle(self, msg: Any) -> None:
        try:
            if isinstance(msg, TokenizedGenerateReq):
                self.scheduler.add_request(msg)
            elif isinstance(msg, AbortReq):
                self.scheduler.abort(msg)
            elif isinstance(msg, ControlCall) and isinstance(msg.request, UpdateWeightsFromDiskReq):
                # Answered later, once the started requests finished (_finish_weight_update).
                self.scheduler.weights.begin_update(msg.call_id, msg.request)
            elif isinstance(msg, ControlCall):
                self.emit(ControlReply(msg.call_id, self._control(msg.request)))
            else:
                logger.error("Scheduler got an unknown message %s", type(msg).__name__)
        except Exception as exc:
            if isinstance(msg, ControlCall) and isinstance(exc, InvalidRequestError):
                # A refused control call (unknown session, bad mode): the caller's mistake.
                logger.info("Refused %s: %s", type(msg.request).__name__, exc)
                self.emit(ControlReply(msg.call_id, exc))
                return
            logger.exception("Failed to handle %s", type(msg).__name__)
            if isinstance(msg, TokenizedGenerateReq):
                reason = FinishReason("abort", message=f"Invalid request: {exc}", status_code=400)
                self.scheduler.pending_outputs.append(ReqOutput(msg.rid, [], reason, 0, 0, 0))
            elif isinstance(msg, ControlCall):
                self.emit(ControlReply(msg.call_id, exc))

    def _control(self, request: Any) -> Any:
        if isinstance(request, FlushCacheReq):
            return self.scheduler.flush_cache()
        if isinstance(request, GetInfoReq):
            return self.scheduler.info()
        if isinstance(request, ExpertDistributionReq):
            from radixserve.layers.moe import expert_record

            mode = self.scheduler.args.expert_distribution_recorder_mode
            return expert_record.handle(request.action, mode)
        if isinstance(request, RadixTreeReq):
            return self.scheduler.radix_tree(request.max_nodes)
        if isinstance(request, LoadLoRAReq):
            return self.scheduler.lora.load(
                request.lora_id, request.name, request.path, request.pinned
            )
        if isinstance(request, UnloadLoRAReq):
            return self.scheduler.lora.unload(request.lora_id)
        if isinstance(request, PauseGenerationReq):
            return self.scheduler.pause(request.mode)
        if isinstance(request, ContinueGenerationReq):
            return self.scheduler.resume()
        if isinstance(request, OpenSessionReq):
            return self.scheduler.open_session(request.session_id, request.capacity_of_str_len)
        if isinstance(request, CloseSessionReq):
            return self.scheduler.close_session(request.session_id)
        if isinstance(request, GetWeightsByNameReq):
            return self.scheduler.weights.get_weights_by_name(request.name, request.truncate_size)
        if isinstance(request, ReleaseMemoryReq):
            return self.scheduler.weights.release(request.tags)
        if isinstance(request, ResumeMemoryReq):
            return self.scheduler.weights.resume(request.tags)
        raise TypeError(f"unknown control request {type(request).__name__}")

    def _finish_weight_update(self) -> None:
        call_id, result = self.scheduler.weights.finish_update()
        self.emit(ControlReply(call_id, result))

    def _step(self) -> None:
        try:
            self.scheduler.step_and_stash()
        except Exception:
            # The clients get the id, the log gets the traceback (as the API's own 500s).
            error_id = f"err-{uuid.uuid4().hex[:16]}"
            logger.exception(
                "Scheduler step failed (error id %s); aborting the requests in flight", error_id
            )
            self.scheduler.fail_all(
                f"Internal error while running the batch (request id {error_id})."
            )

    def _flush_outputs(self) -> None:
        outputs = self.scheduler.step_outputs_only()
        if not outputs:
            return
        if self.detokenizer is not None:
            self.detokenizer.handle(outputs)
        self.emit(BatchOutput(outputs))
