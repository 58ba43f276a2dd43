"""API side: routes scheduler outputs to the caller waiting on each request id, and answers
control calls. Transport-agnostic; the runtimes feed it messages."""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from radixserve.errors import InvalidRequestError
from radixserve.messages import BatchOutput, ControlCall, ControlReply, FinishReason, ReqOutput

logger = logging.getLogger(__name__)

Sink = Callable[[ReqOutput], None]


class RuntimeDeadError(RuntimeError):
    """The scheduler (or detokenizer) is gone; no request can be served."""


class RequestRouter:
    def __init__(self) -> None:
        self.sinks: dict[str, Sink] = {}
        self.calls: dict[int, queue.Queue[Any]] = {}
        self.lock = threading.Lock()
        self.call_ids = itertools.count()

    def register(self, rid: str, sink: Sink) -> None:
        with self.lock:
            if rid in self.sinks:
                raise InvalidRequestError(f"Duplicate request id {rid!r}.", "rid")
            self.sinks[rid] = sink

    def new_call(self, request: Any) -> tuple[ControlCall, queue.Queue[Any]]:
        reply: queue.Queue[Any] = queue.Queue(maxsize=1)
        call = ControlCall(next(self.call_ids), request)
        with self.lock:
            self.calls[call.call_id] = reply
        return call, reply

    def on_message(self, msg: Any) -> None:
        if isinstance(msg, BatchOutput):
            for out in msg.outputs:
                self._deliver(out)
        elif isinstance(msg, ControlReply):
            with self.lock:
                reply = self.calls.pop(msg.call_id, None)
            if reply is not None:
                reply.put(msg.result)
        else:
            logger.error("Router got an unknown message %s", type(msg).__name__)

    def _deliver(self, out: ReqOutput) -> None:
        with self.lock:
            sink = self.sinks.get(out.rid)
            if out.finished is not None:
                self.sinks.pop(out.rid, None)
        if sink is not None:
            sink(out)

    def fail_all(self, message: str, status_code: int) -> None:
        """End every waiting request (each once) and every pending control call."""
        with self.lock:
            rids = list(self.sinks)
            calls = list(self.calls.values())
            self.calls.clear()
        for rid in rids:
            reason = FinishReason("abort", message=message, status_code=status_code)
            self._deliver(ReqOutput(rid, [], reason, 0, 0, 0, text=""))
        for reply in calls:
            reply.put(RuntimeDeadError(message))
