"""The detokenizer process: token ids from the scheduler in, text deltas out to the API
process. Everything that is not a batch of outputs is forwarded unchanged."""

from __future__ import annotations

import logging
import signal
from typing import TYPE_CHECKING, Any

import zmq

from radixserve.managers.detokenizer_manager import DetokenizerManager
from radixserve.managers.process_utils import (
    apply_gc_threshold,
    configure_child_logging,
    die_with_parent,
)
from radixserve.messages import BatchOutput, SchedulerReady

if TYPE_CHECKING:
    from radixserve.server_args import ServerArgs

logger = logging.getLogger(__name__)


def run_detokenizer_process(
    server_args: ServerArgs, in_addr: str, out_addr: str, parent_pid: int
) -> None:
    die_with_parent(parent_pid)
    configure_child_logging(server_args.log_level, "detokenizer")
    apply_gc_threshold(server_args.gc_threshold)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    ctx = zmq.Context()
    receiver = ctx.socket(zmq.PULL)
    receiver.bind(in_addr)
    sender = ctx.socket(zmq.PUSH)
    sender.connect(out_addr)
    manager: DetokenizerManager | None = None
    while True:
        msg: Any = receiver.recv_pyobj()
        if isinstance(msg, SchedulerReady):
            manager = DetokenizerManager(_load_tokenizer(server_args, msg.model_dir))
        elif isinstance(msg, BatchOutput) and manager is not None:
            manager.handle(msg.outputs)
        sender.send_pyobj(msg)


def _load_tokenizer(server_args: ServerArgs, model_dir: str) -> Any:
    if server_args.skip_tokenizer_init:
        return None
    from radixserve.managers.inprocess_runtime import tokenizer_path_for
    from radixserve.utils.tokenizer import get_tokenizer

    return get_tokenizer(
        tokenizer_path_for(server_args, model_dir),
        tokenizer_mode=server_args.tokenizer_mode,
        trust_remote_code=server_args.trust_remote_code,
        revision=server_args.revision,
    )


def _exit_on_signal(*_: Any) -> None:
    raise SystemExit(0)
