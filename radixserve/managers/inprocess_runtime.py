"""The scheduler on a background thread of the caller's process (for the offline Engine in
tests and notebooks: one process, direct access to the scheduler for inspection)."""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING, Any

from radixserve.managers.detokenizer_manager import DetokenizerManager
from radixserve.managers.request_router import RequestRouter, RuntimeDeadError, Sink
from radixserve.managers.scheduler_loop import SchedulerLoop
from radixserve.messages import AbortReq, SchedulerReady, TokenizedGenerateReq

if TYPE_CHECKING:
    from radixserve.server_args import ServerArgs

CALL_TIMEOUT_S = 60.0


class InProcessRuntime:
    def __init__(self, server_args: ServerArgs) -> None:
        from radixserve.managers.scheduler import Scheduler
        from radixserve.model_executor.model_runner import ModelRunner
        from radixserve.utils.tokenizer import get_tokenizer

        self.runner = ModelRunner(server_args)
        self.tokenizer = None
        if not server_args.skip_tokenizer_init:
            self.tokenizer = get_tokenizer(
                tokenizer_path_for(server_args, str(self.runner.model_dir)),
                tokenizer_mode=server_args.tokenizer_mode,
                trust_remote_code=server_args.trust_remote_code,
                revision=server_args.revision,
            )
        self.scheduler = Scheduler(server_args, self.runner, self.tokenizer)
        cfg = self.runner.model_config
        self.ready = SchedulerReady(
            model_dir=str(self.runner.model_dir),
            vocab_size=cfg.vocab_size,
            context_len=cfg.context_len,
            max_total_tokens=self.runner.plan.max_total_tokens,
            max_running_requests=self.runner.plan.max_running_requests,
            architectures=tuple(cfg.architectures),
        )
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
        self.router.fail_all("The engine is shutting down.", status_code=503)


def tokenizer_path_for(server_args: ServerArgs, model_dir: str) -> str:
    """An explicit --tokenizer-path wins; otherwise the model's folder (for a GGUF, the
    converted folder that holds the tokenizer files)."""
    if server_args.tokenizer_path and server_args.tokenizer_path != server_args.model_path:
        return server_args.tokenizer_path
    return model_dir
