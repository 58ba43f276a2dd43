"""The detokenizer process: token ids from the scheduler in, text deltas out to the API
process. Everything that is not a batch of outputs is forwarded unchanged."""

from __future__ import annotations

import logging
import signal
from typing import TYPE_CHECKING, Any

from radixserve.managers.detokenizer_manager import DetokenizerManager
from radixserve.managers.light_detokenizer import LightDecoder
from radixserve.managers.process_utils import start_child
from radixserve.managers.scheduler_factory import load_tokenizer
from radixserve.messages import BatchOutput, SchedulerReady
from radixserve.utils.cpu_threads import CpuPlan, run_light

if TYPE_CHECKING:
    from radixserve.server_args import ServerArgs

logger = logging.getLogger(__name__)


def run_detokenizer_process(
    server_args: ServerArgs, in_addr: str, out_addr: str, parent_pid: int, cpu_plan: CpuPlan
) -> None:
    receiver, sender = start_child("detokenizer", server_args, in_addr, out_addr, parent_pid)
    run_light(cpu_plan)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    manager: DetokenizerManager | None = None
    while True:
        msg: Any = receiver.recv_pyobj()
        if isinstance(msg, SchedulerReady) and manager is None:  # one per dp replica
            manager = DetokenizerManager(_decoder_for(server_args, msg))
        elif isinstance(msg, BatchOutput) and manager is not None:
            manager.handle(msg.outputs)
        sender.send_pyobj(msg)


def _decoder_for(server_args: ServerArgs, ready: SchedulerReady) -> Any:
    if ready.light_decoder is not None:
        logger.debug("detokenizer decodes with the tokenizers library alone")
        return LightDecoder(ready.light_decoder)
    return load_tokenizer(
        server_args, ready.model_dir, light=True, class_name=ready.tokenizer_class
    )


def _exit_on_signal(*_: Any) -> None:
    raise SystemExit(0)
