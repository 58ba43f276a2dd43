"""The scheduler process: loads the model, then runs the SchedulerLoop over ZMQ.

It receives requests from the API process and sends outputs (token ids) to the detokenizer
process; the first message it sends is SchedulerReady (or SchedulerFailed)."""

from __future__ import annotations

import logging
import signal
import traceback
from typing import TYPE_CHECKING, Any

import zmq

from radixserve.managers.process_utils import (
    apply_gc_threshold,
    configure_child_logging,
    die_with_parent,
)
from radixserve.messages import SchedulerFailed, SchedulerReady

if TYPE_CHECKING:
    from radixserve.server_args import ServerArgs

logger = logging.getLogger(__name__)


def run_scheduler_process(
    server_args: ServerArgs, in_addr: str, out_addr: str, parent_pid: int
) -> None:
    die_with_parent(parent_pid)
    configure_child_logging(server_args.log_level, "scheduler")
    apply_gc_threshold(server_args.gc_threshold)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    ctx = zmq.Context()
    receiver = ctx.socket(zmq.PULL)
    receiver.bind(in_addr)
    sender = ctx.socket(zmq.PUSH)
    sender.connect(out_addr)
    try:
        scheduler, ready = _build(server_args)
    except Exception as exc:
        logger.error("The scheduler failed to start: %s", exc)
        logger.debug("%s", traceback.format_exc())
        sender.send_pyobj(SchedulerFailed(f"{type(exc).__name__}: {exc}"))
        sender.close(linger=2000)
        raise SystemExit(1) from None
    sender.send_pyobj(ready)

    from radixserve.managers.scheduler_loop import SchedulerLoop

    def receive(timeout: float | None) -> list[Any]:
        msgs = []
        if receiver.poll(0 if timeout is None else int(timeout * 1000)):
            msgs.append(receiver.recv_pyobj())
            while receiver.poll(0):
                msgs.append(receiver.recv_pyobj())
        return msgs

    def stop(*_: Any) -> None:
        loop.stop_event.set()

    loop = SchedulerLoop(scheduler, receive, sender.send_pyobj)
    signal.signal(signal.SIGTERM, stop)
    loop.run()


def _build(server_args: ServerArgs) -> tuple[Any, SchedulerReady]:
    from radixserve.managers.inprocess_runtime import tokenizer_path_for
    from radixserve.managers.scheduler import Scheduler
    from radixserve.model_executor.model_runner import ModelRunner
    from radixserve.utils.tokenizer import get_tokenizer

    runner = ModelRunner(server_args)
    tokenizer = None
    if not server_args.skip_tokenizer_init:
        tokenizer = get_tokenizer(
            tokenizer_path_for(server_args, str(runner.model_dir)),
            tokenizer_mode=server_args.tokenizer_mode,
            trust_remote_code=server_args.trust_remote_code,
            revision=server_args.revision,
        )
    scheduler = Scheduler(server_args, runner, tokenizer)
    cfg = runner.model_config
    ready = SchedulerReady(
        model_dir=str(runner.model_dir),
        vocab_size=cfg.vocab_size,
        context_len=cfg.context_len,
        max_total_tokens=runner.plan.max_total_tokens,
        max_running_requests=runner.plan.max_running_requests,
        architectures=tuple(cfg.architectures),
    )
    return scheduler, ready
