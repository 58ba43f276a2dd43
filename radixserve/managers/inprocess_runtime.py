"""The scheduler on a background thread of the caller's process (for the offline Engine in
tests and notebooks: one process, direct access to the scheduler for inspection)."""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING, Any

from radixserve.managers.detokenizer_manager import DetokenizerManager
from radixserve.managers.request_router import RequestRouter, RuntimeDeadError, Sink
from radixserve.managers.scheduler_factory import build_scheduler
from radixserve.managers.scheduler_loop import SchedulerLoop
from radixserve.messages import AbortReq, TokenizedGenerateReq

if TYPE_CHECKING:
    from radixserve.server_args import ServerArgs

CALL_TIMEOUT_S = 60.0


class InProcessRuntime:
    def __init__(self, server_args: ServerArgs) -> None:
        if server_args.tp_size > 1:
            raise ValueError(
                f"--tp-size {server_args.tp_size} needs one process per rank: use "
                "runtime='process' (the default), not runtime='thread'"
            )
        if server_args.pp_size > 1:
            raise ValueError(
                f"--pp-size {server_args.pp_size} needs one process per rank: use "
                "runtime='process' (the default), not runtime='thread'"
            )
        if server_args.dp_size > 1:
            raise ValueError(
                f"--dp-size {server_args.dp_size} runs one scheduler process per replica: use "
                "runtime='process' (the default), not runtime='thread'"
            )
        if server_args.use_ray:
            raise ValueError(
                "--use-ray runs the scheduler as a Ray actor: use runtime='process' (the "
                "default), not runtime='thread'"
            )
        self.scheduler, self.tokenizer, self.ready = build_scheduler(server_args)
        self.runner = self.scheduler.runner
        self.router = RequestRouter()
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.loop = SchedulerLoop(
            self.scheduler,
            self._receive,
            self.router.on_message,
            DetokenizerManager(self.tokenizer),
        )
        self.thread = threading.Thread(
            target=self.loop.run, name="radixserve-scheduler", daemon=True
        )
        self.thread.start()

    def _receive(self, timeout: float | None) -> list[Any]:
        msgs: list[Any] = []
        try:
            msgs.append(self.inbox.get(timeout=timeout) if timeout else self.inbox.get_nowait())
            while True:
                msgs.append(self.inbox.get_nowait())
        except queue.Empty:
            pass
        return msgs

    def is_alive(self) -> bool:
        return self.thread.is_alive()

    def submit(self, msg: TokenizedGenerateReq, sink: Sink) -> None:
        if not self.is_alive():
            raise RuntimeDeadError("The engine is not running.")
        self.router.register(msg.rid, sink)
        self.inbox.put(msg)

    def abort(self, rid: str | None = None, abort_all: bool = False) -> None:
        self.inbox.put(AbortReq(rid=rid, abort_all=abort_all))

    def call(self, request: Any, timeout: float = CALL_TIMEOUT_S) -> Any:
        call, reply = self.router.new_call(request)
        self.inbox.put(call)
        result = reply.get(timeout=timeout)
        if isinstance(result, Exception):
            raise result
        return result

    def shutdown(self) -> None:
        self.loop.stop_event.set()
        self.thread.join(timeout=30)
        self.loop.scheduler.close()
        self.router.fail_all("The engine is shutting down.", status_code=503)
