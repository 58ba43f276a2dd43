"""A tensor-parallel rank above 0: loads its shard of the model, then runs every forward step
rank 0 (the scheduler process) broadcasts. It has no sockets: everything it needs arrives
through torch.distributed, and its logits are dropped (rank 0 samples)."""

from __future__ import annotations

import logging
import os
import signal
from typing import TYPE_CHECKING

from radixserve.distributed.launch import DistConfig, RankLostError, init_tensor_parallel
from radixserve.managers.process_utils import (
    apply_gc_threshold,
    configure_child_logging,
    die_with_parent,
    freeze_startup_objects,
)
from radixserve.managers.tp_sync import exit_rank, follow
from radixserve.utils.cpu_threads import CpuPlan, claim_compute_cores

if TYPE_CHECKING:
    from radixserve.server_args import ServerArgs

logger = logging.getLogger(__name__)


def run_tp_worker_process(
    server_args: ServerArgs, rank: int, dist: DistConfig, parent_pid: int, cpu_plan: CpuPlan
) -> None:
    die_with_parent(parent_pid)
    configure_child_logging(server_args.log_level, f"tp-rank-{rank}")
    apply_gc_threshold(server_args.gc_threshold)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        from radixserve.kernels import ops

        claim_compute_cores(cpu_plan, ops.bind_threads)
        init_tensor_parallel(dist, rank)
        from radixserve.mem_cache.req_to_token_pool import ReqToTokenPool
        from radixserve.model_executor.model_runner import ModelRunner

        runner = ModelRunner(server_args)
        # The same shape as rank 0's table; only the rows each step reads are kept in sync.
        table = ReqToTokenPool(
            runner.plan.max_running_requests, runner.model_config.context_len, runner.device
        ).req_to_token
    except (Exception, RankLostError) as exc:
        exit_rank(rank, f"failed to start: {exc}")
        return
    freeze_startup_objects()
    try:
        follow(runner, table)
    except (Exception, RankLostError) as exc:
        exit_rank(rank, f"lost contact with the other ranks ({exc})")
    logger.info("TP rank %d: rank 0 asked to stop", rank)
    os._exit(0)
