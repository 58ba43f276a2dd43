"""The scheduler process: loads the model, then runs the SchedulerLoop over ZMQ.

It receives requests from the API process and sends outputs (token ids) to the detokenizer
process; the first message it sends is SchedulerReady (or SchedulerFailed)."""

from __future__ import annotations

import logging
import signal
import traceback
from typing import TYPE_CHECKING, Any

from radixserve.managers.process_utils import start_child
from radixserve.managers.scheduler_factory import build_scheduler
from radixserve.messages import SchedulerFailed
from radixserve.utils.cpu_threads import CpuPlan, claim_compute_cores

if TYPE_CHECKING:
    from radixserve.server_args import ServerArgs

logger = logging.getLogger(__name__)


def run_scheduler_process(
    server_args: ServerArgs, in_addr: str, out_addr: str, parent_pid: int, cpu_plan: CpuPlan
) -> None:
    receiver, sender = start_child("scheduler", server_args, in_addr, out_addr, parent_pid)
    try:
        claim_compute_cores(cpu_plan)
        scheduler, _, ready = build_scheduler(server_args)
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
