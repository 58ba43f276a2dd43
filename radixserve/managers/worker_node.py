"""A node above 0 of a multi-node tensor-parallel group (distributed/nodes.py has the layout):
it runs this node's TP worker processes, which meet the others at --dist-init-addr, until rank
0 stops them (node 0 shut down) or one fails. It serves no HTTP."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import time
from typing import TYPE_CHECKING, Any

from radixserve.distributed.nodes import node_dist_config, node_layout
from radixserve.managers.tp_worker_process import run_tp_worker_process

if TYPE_CHECKING:
    from radixserve.server_args import ServerArgs

logger = logging.getLogger(__name__)

POLL_S = 0.5


def run_worker_node(server_args: ServerArgs) -> int:
    """A node above 0: run this node's ranks until they end. 0 when rank 0 stopped them (node
    0 shut down), 1 when a rank failed (lost node 0 or another node, or could not start)."""
    layout = node_layout(server_args)
    dist = node_dist_config(server_args)
    plans = {rank: layout.cpu_plan(rank) for rank in layout.local_ranks}
    spawn = mp.get_context("spawn")
    procs = [
        spawn.Process(
            target=run_tp_worker_process,
            args=(server_args, rank, dist, os.getpid(), plans[rank]),
            name=f"radixserve-tp-rank-{rank}",
            daemon=True,
        )
        for rank in layout.local_ranks
    ]
    for proc in procs:
        proc.start()
    logger.info(
        "Node %d of %d: running TP ranks %d-%d of %d, joining %s (timeout %d s); node 0 "
        "serves HTTP, this node has no HTTP server",
        layout.node_rank,
        layout.nnodes,
        layout.local_ranks.start,
        layout.local_ranks.stop - 1,
        layout.tp_size,
        dist.init_addr,
        dist.timeout_s,
    )
    stopping = False

    def stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        return _watch(procs, lambda: stopping)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()


def _watch(procs: list[Any], stopping: Any) -> int:
    while not stopping():
        ended = [p for p in procs if not p.is_alive()]
        if any(p.exitcode != 0 for p in ended):
            failed = ", ".join(f"{p.name} (code {p.exitcode})" for p in ended if p.exitcode)
            logger.error(
                "This node's TP ranks stopped: %s exited; the TP group is broken (node 0 or "
                "another node gone, or a rank failed to start); exiting",
                failed,
            )
            return 1
        if len(ended) == len(procs):
            logger.info("Rank 0 stopped the TP group (node 0 shut down); exiting")
            return 0
        time.sleep(POLL_S)
    logger.info("Stopping this node's TP ranks")
    return 0
