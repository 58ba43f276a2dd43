"""Drives the scheduler on a background thread and routes its outputs to waiting callers.

Callers submit messages (new requests, aborts, flushes) through a thread-safe inbox and register
a sink per request id; the loop runs scheduler steps while there is work and sleeps on the inbox
otherwise. A step that raises fails the requests in flight (each ends once, with an abort) and
the loop keeps serving.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from radixserve.messages import (
    AbortReq,
    FinishReason,
    FlushCacheReq,
    ReqOutput,
    TokenizedGenerateReq,
)

if TYPE_CHECKING:
    from radixserve.managers.scheduler import Scheduler

logger = logging.getLogger(__name__)

Sink = Callable[[ReqOutput], None]
IDLE_WAIT_S = 0.05


class EngineLoop:
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.inbox: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.sinks: dict[str, Sink] = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="radixserve-scheduler", daemon=True)
        self.thread.start()

    def submit(self, msg: TokenizedGenerateReq, sink: Sink) -> None:
        with self.lock:
            if msg.rid in self.sinks:
                raise ValueError(f"Duplicate request id {msg.rid!r}.")
            self.sinks[msg.rid] = sink
        self.inbox.put((msg, None))

    def abort(self, rid: str | None = None, abort_all: bool = False) -> None:
        self.inbox.put((AbortReq(rid=rid, abort_all=abort_all), None))

    def call(self, msg: Any) -> Any:
        """Run a control message on the scheduler thread and wait for its answer."""
        done: queue.Queue[Any] = queue.Queue(maxsize=1)
        self.inbox.put((msg, done))
        return done.get()

    def shutdown(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self.inbox.put((None, None))
        self.thread.join(timeout=30)
        self._fail_all("The engine is shutting down.", status_code=503)

    # -- scheduler thread -------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            block = not self.scheduler.has_work()
            try:
                item = self.inbox.get(timeout=IDLE_WAIT_S) if block else self.inbox.get_nowait()
            except queue.Empty:
                item = None
            while item is not None:
                self._handle(*item)
                try:
                    item = self.inbox.get_nowait()
                except queue.Empty:
                    item = None
            if self._stop.is_set():
                break
            if self.scheduler.has_work():
                self._step()

    def _handle(self, msg: Any, reply: queue.Queue[Any] | None) -> None:
        if msg is None:
            return
        result: Any = None
        try:
            if isinstance(msg, TokenizedGenerateReq):
                self.scheduler.add_request(msg)
            elif isinstance(msg, AbortReq):
                self.scheduler.abort(msg)
            elif isinstance(msg, FlushCacheReq):
                result = self.scheduler.flush_cache()
            elif callable(msg):
                result = msg(self.scheduler)
            else:
                raise TypeError(f"unknown message {type(msg).__name__}")
        except Exception as exc:  # one bad message must not stop the loop
            logger.exception("Failed to handle %s", type(msg).__name__)
            result = exc
            if isinstance(msg, TokenizedGenerateReq):
                self._deliver_error(msg.rid, str(exc))
        if reply is not None:
            reply.put(result)
        if self.scheduler.pending_outputs:
            self._dispatch(self.scheduler.step_outputs_only())

    def _step(self) -> None:
        try:
            outputs = self.scheduler.step()
        except Exception:
            logger.exception("Scheduler step failed; aborting the requests in flight")
            outputs = self.scheduler.fail_all("Internal error while running the batch.")
        self._dispatch(outputs)

    def _dispatch(self, outputs: list[ReqOutput]) -> None:
        for out in outputs:
            with self.lock:
                sink = self.sinks.get(out.rid)
                if out.finished is not None:
                    self.sinks.pop(out.rid, None)
            if sink is not None:
                sink(out)

    def _deliver_error(self, rid: str, message: str) -> None:
        reason = FinishReason("abort", message=message, status_code=500)
        self._dispatch([ReqOutput(rid, [], reason, 0, 0, 0)])

    def _fail_all(self, message: str, status_code: int) -> None:
        with self.lock:
            rids = list(self.sinks)
        for rid in rids:
            reason = FinishReason("abort", message=message, status_code=status_code)
            self._dispatch([ReqOutput(rid, [], reason, 0, 0, 0)])
