"""The scheduler process: loads the model, then runs the SchedulerLoop over ZMQ.

It receives requests from the API process and sends outputs (token ids) to the detokenizer
process; the first message it sends is SchedulerReady (or SchedulerFailed)."""

from __future__ import annotations

import logging
import os
import signal
import traceback
from typing import TYPE_CHECKING, Any

from radixserve.distributed.launch import DistConfig, RankLostError, init_tensor_parallel
from radixserve.managers.process_utils import freeze_startup_objects, start_child
from radixserve.managers.scheduler_factory import build_scheduler
from radixserve.messages import SchedulerFailed
from radixserve.utils.cpu_threads import CpuPlan, claim_compute_cores

if TYPE_CHECKING:
    from radixserve.server_args import ServerArgs

logger = logging.getLogger(__name__)


def run_scheduler_process(
    server_args: ServerArgs,
    in_addr: str,
    out_addr: str,
    parent_pid: int,
    cpu_plan: CpuPlan,
    dist: DistConfig | None = None,
    dp_rank: int | None = None,
) -> None:
    """The scheduler; with `dist` (--tp-size > 1) also tensor-parallel rank 0, which
    broadcasts each step to the other ranks (managers/tp_sync.py); with `dp_rank`
    (--dp-size > 1) one data-parallel replica's."""
    name = "scheduler" if dp_rank is None else f"scheduler-dp{dp_rank}"
    receiver, sender = start_child(name, server_args, in_addr, out_addr, parent_pid)
    leader = None
    try:
        from radixserve.utils.gguf_prefetch import start_for

        start_for(server_args)  # the GGUF's blocks read on a thread while torch is imported
        from radixserve.kernels import ops

        claim_compute_cores(cpu_plan, ops.bind_threads)
        if dist is not None:
            init_tensor_parallel(dist, 0)
        elif dp_rank and server_args.device == "cuda":
            import torch

            torch.cuda.set_device(dp_rank % torch.cuda.device_count())  # a GPU per replica
        scheduler, _, ready = build_scheduler(server_args, decode_only_tokenizer=True)
        if dist is not None:
            from radixserve.managers.tp_sync import TpLeader

            leader = TpLeader(scheduler.runner, scheduler.kv.req_to_token_pool, dist.timeout_s)
    except (Exception, RankLostError) as exc:
        logger.error("The scheduler failed to start: %s", exc)
        logger.debug("%s", traceback.format_exc())
        sender.send_pyobj(SchedulerFailed(f"{type(exc).__name__}: {exc}"))
        sender.close(linger=2000)
        if dist is not None:
            os._exit(1)  # a process group with a failed peer can hang the normal exit
        raise SystemExit(1) from None
    sender.send_pyobj(ready)
    freeze_startup_objects()

    from radixserve.managers.scheduler_loop import SchedulerLoop

    def receive(timeout: float | None) -> list[Any]:
        msgs = []
        if receiver.poll(0 if timeout is None else int(timeout * 1000)):
            msgs.append(receiver.recv_pyobj())
            while receiver.poll(0):
                msgs.append(receiver.recv_pyobj())
        if leader is not None and not msgs and not scheduler.has_work():
            leader.heartbeat_if_due()  # idle: keep the other ranks' wait short of the timeout
        return msgs

    def stop(*_: Any) -> None:
        loop.stop_event.set()

    loop = SchedulerLoop(scheduler, receive, sender.send_pyobj)
    signal.signal(signal.SIGTERM, stop)
    if leader is None:
        loop.run()
        scheduler.close()
        return
    from radixserve.managers.tp_sync import exit_rank

    try:
        loop.run()
    except RankLostError as exc:
        exit_rank(0, f"lost contact with the other ranks ({exc})")
    leader.shutdown()
    sender.close(linger=1000)
    os._exit(0)
