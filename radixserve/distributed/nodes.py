"""Several machines ("nodes") sharing one tensor-parallel group, as SGLang runs them:

    node 0:  radixserve serve --tp-size 4 --nnodes 2 --node-rank 0 --dist-init-addr HOST:PORT
    node 1:  radixserve serve --tp-size 4 --nnodes 2 --node-rank 1 --dist-init-addr HOST:PORT

Each node runs tp_size / nnodes ranks; node k holds the global ranks k * per_node ... k *
per_node + per_node - 1, so rank 0 (the scheduler) is on node 0, which alone serves HTTP. A
node above 0 runs its ranks only (run_worker_node), all of them meeting at --dist-init-addr.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from radixserve.distributed.launch import DistConfig, dist_config_for
from radixserve.utils.cpu_threads import CpuPlan, plan_cpus

if TYPE_CHECKING:
    from radixserve.server_args import ServerArgs

logger = logging.getLogger(__name__)

POLL_S = 0.5


@dataclass(frozen=True)
class NodeLayout:
    tp_size: int
    nnodes: int
    node_rank: int

    @property
    def ranks_per_node(self) -> int:
        return self.tp_size // self.nnodes

    @property
    def local_ranks(self) -> range:
        """The global TP ranks this node runs (node_rank * ranks_per_node + local rank)."""
        first = self.node_rank * self.ranks_per_node
        return range(first, first + self.ranks_per_node)

    def cpu_plan(self, rank: int) -> CpuPlan:
        """Cores for global `rank`: this node's cores are split between its own ranks only.
        Call before any process changes its affinity (children inherit it)."""
        return plan_cpus(rank - self.local_ranks.start, tp_size=self.ranks_per_node)


def node_layout(server_args: ServerArgs) -> NodeLayout:
    return NodeLayout(server_args.tp_size, server_args.nnodes, server_args.node_rank)


def node_dist_config(server_args: ServerArgs) -> DistConfig:
    return dist_config_for(
        server_args.tp_size,
        server_args.device,
        server_args.dist_init_addr,
        server_args.nccl_port,
        server_args.dist_timeout,
    )


def run_worker_node(server_args: ServerArgs) -> int:
    """A node above 0: run this node's ranks until they end. 0 when rank 0 stopped them (node
    0 shut down), 1 when a rank failed (lost node 0 or another node, or could not start)."""
    from radixserve.managers.tp_worker_process import run_tp_worker_process

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
