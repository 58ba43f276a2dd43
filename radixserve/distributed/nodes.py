"""Several machines ("nodes") sharing one tensor-parallel group, as SGLang runs them:

    node 0:  radixserve serve --tp-size 4 --nnodes 2 --node-rank 0 --dist-init-addr HOST:PORT
    node 1:  radixserve serve --tp-size 4 --nnodes 2 --node-rank 1 --dist-init-addr HOST:PORT

Each node runs tp_size / nnodes ranks; node k holds the global ranks k * per_node ... k *
per_node + per_node - 1, so rank 0 (the scheduler) is on node 0, which alone serves HTTP. A
node above 0 runs its ranks only (managers/worker_node.py), all of them meeting at
--dist-init-addr. This module is the layout: which ranks, cores and rendezvous a node has.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixserve.distributed.launch import DistConfig, dist_config_for
from radixserve.utils.cpu_threads import CpuPlan, plan_cpus

if TYPE_CHECKING:
    from radixserve.server_args import ServerArgs

logger = logging.getLogger(__name__)


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
