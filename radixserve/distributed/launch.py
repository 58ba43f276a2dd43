"""Joining the tensor-parallel process group: where ranks meet, with which backend, how long
they wait for each other.

Every rank calls init_tensor_parallel with the same address; torch.distributed's TCP store on
that address is the rendezvous. Gloo carries the collectives on the CPU, NCCL on CUDA.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from datetime import timedelta

logger = logging.getLogger(__name__)

# SGLang leaves --dist-timeout unset by default (torch's own default, 10 minutes for gloo).
DEFAULT_DIST_TIMEOUT_S = 600


@dataclass(frozen=True)
class DistConfig:
    """What every rank needs to join the group (picklable: it travels to spawned processes)."""

    init_addr: str  # host:port of the rendezvous store
    world_size: int
    timeout_s: int
    backend: str  # "gloo" or "nccl"
    # The GPU of rank 0 (with --dp-size, replica d's ranks start at GPU d * tp).
    base_gpu: int = 0
    # Pipeline stages (--pp-size): world_size = tp_size * pp_size (distributed/pipeline_layout.py).
    pp_size: int = 1


def free_local_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def dist_config_for(
    world_size: int,
    device: str,
    dist_init_addr: str | None,
    nccl_port: int | None,
    dist_timeout: int | None,
) -> DistConfig:
    """--dist-init-addr wins; else 127.0.0.1 on --nccl-port; else a free local port."""
    addr = dist_init_addr or f"127.0.0.1:{nccl_port or free_local_port()}"
    backend = "nccl" if device == "cuda" else "gloo"
    return DistConfig(addr, world_size, dist_timeout or DEFAULT_DIST_TIMEOUT_S, backend)


def init_tensor_parallel(config: DistConfig, rank: int) -> None:
    """Join the group as `rank` (blocks until all ranks have joined or the timeout passes)."""
    import torch
    import torch.distributed as dist

    if config.backend == "nccl":
        torch.cuda.set_device((config.base_gpu + rank) % torch.cuda.device_count())
    dist.init_process_group(
        backend=config.backend,
        init_method=f"tcp://{config.init_addr}",
        world_size=config.world_size,
        rank=rank,
        timeout=timedelta(seconds=config.timeout_s),
    )
    if config.pp_size > 1:
        from radixserve.distributed.pipeline_groups import join_pipeline_groups

        join_pipeline_groups(config.world_size // config.pp_size, config.pp_size, rank)
    logger.info(
        "Rank %d of %d joined (%s via %s, timeout %d s)",
        rank,
        config.world_size,
        config.backend,
        config.init_addr,
        config.timeout_s,
    )


class RankLostError(BaseException):
    """A collective failed or timed out: the ranks are out of step and nothing on this rank can
    bring them back. A BaseException so the scheduler loop's per-step recovery (which catches
    Exception) does not swallow it; the process exits instead."""
