"""Tensor- and pipeline-parallel group state and the collectives the TP-aware layers need.

With torch.distributed not initialised everything is single-rank: rank 0, size 1, and the
collectives are identities. Layers call these functions through the module (never import the
names) so that tests can monkeypatch a fake tp size.

Under pipeline parallelism (--pp-size) the world is pp_size stages of tp_size ranks each
(global rank = stage * tp_size + tp rank); the TP group is the ranks of this rank's stage, and
broadcast_object (rank 0's step plan) spans the whole world.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

# None means "the default (WORLD) group when torch.distributed is initialised".
_TP_GROUP: dist.ProcessGroup | None = None
# This rank's pipeline stage and the number of stages (0 and 1 without pipeline parallelism).
_PP_RANK = 0
_PP_SIZE = 1
# --ep-size: the TP group is ep_size expert-parallel ranks of tp_size / ep_size MoE-TP ranks each
# (SGLang's layout: EP rank = tp_rank // moe_tp_size). Only MoE layers read it.
_EP_SIZE = 1


def set_tp_group(group: dist.ProcessGroup | None) -> None:
    """Use `group` for tensor parallelism (None: the default group)."""
    global _TP_GROUP
    _TP_GROUP = group


def set_pp(rank: int, size: int) -> None:
    """This process is pipeline stage `rank` of `size` (distributed/pipeline_groups.py)."""
    global _PP_RANK, _PP_SIZE
    _PP_RANK, _PP_SIZE = rank, size


def set_ep_size(size: int) -> None:
    """Split MoE experts over `size` groups of the TP ranks (1: every rank holds every expert)."""
    global _EP_SIZE
    _EP_SIZE = size


def get_ep_size() -> int:
    """The expert-parallel size, capped at 1 when not distributed (a single rank holds all)."""
    return _EP_SIZE if get_tp_size() > 1 else 1


def get_moe_tp_size() -> int:
    """Ranks that split one expert's intermediate dimension: tp_size / ep_size."""
    return divide(get_tp_size(), get_ep_size(), "tensor parallel size")


def get_ep_rank() -> int:
    """This rank's expert-parallel group: which contiguous run of experts it holds."""
    return get_tp_rank() // get_moe_tp_size()


def get_moe_tp_rank() -> int:
    """This rank's place within its expert-parallel group (its slice of each local expert)."""
    return get_tp_rank() % get_moe_tp_size()


def get_pp_rank() -> int:
    return _PP_RANK


def get_pp_size() -> int:
    return _PP_SIZE


def get_world_size() -> int:
    """Every rank of this replica's process group (tp_size * pp_size); 1 when not distributed."""
    if not _distributed_ready():
        return 1
    return dist.get_world_size()


def _distributed_ready() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_tp_rank() -> int:
    if not _distributed_ready():
        return 0
    return dist.get_rank(group=_TP_GROUP)


def get_tp_size() -> int:
    if not _distributed_ready():
        return 1
    return dist.get_world_size(group=_TP_GROUP)


def tensor_model_parallel_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Sum `tensor` over the TP ranks (in place when there is more than one rank)."""
    if get_tp_size() == 1:
        return tensor
    dist.all_reduce(tensor, group=_TP_GROUP)
    return tensor


def tensor_model_parallel_broadcast(tensor: torch.Tensor, src_tp_rank: int) -> torch.Tensor:
    """TP rank `src_tp_rank`'s `tensor` on every TP rank (in place; identity on one rank)."""
    if get_tp_size() == 1:
        return tensor
    src = src_tp_rank if _TP_GROUP is None else dist.get_global_rank(_TP_GROUP, src_tp_rank)
    dist.broadcast(tensor, src=src, group=_TP_GROUP)
    return tensor


def tensor_model_parallel_all_gather(tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every TP rank's `tensor` along `dim`, in rank order."""
    world = get_tp_size()
    if world == 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(world)]
    dist.all_gather(parts, tensor.contiguous(), group=_TP_GROUP)
    return torch.cat(parts, dim=dim)


def divide(numerator: int, denominator: int, what: str = "size") -> int:
    """Exact division, with an error that says which dimension does not split over TP ranks."""
    if numerator % denominator != 0:
        raise ValueError(
            f"{what} ({numerator}) is not divisible by the tensor parallel size ({denominator})"
        )
    return numerator // denominator


def kv_heads_per_rank(total_num_kv_heads: int) -> int:
    """KV heads each rank holds: a share when they split, one (replicated) when tp exceeds them.
    QKVParallelLinear decides the same; the KV cache must be sized to match it."""
    tp_size = get_tp_size()
    if tp_size >= total_num_kv_heads:
        return 1
    return divide(total_num_kv_heads, tp_size, "number of kv heads")


def broadcast_object(obj: object, src: int = 0) -> object:
    """Global rank `src`'s `obj` on every rank of the world, all TP ranks of all pipeline stages
    (pickled by torch.distributed); identity on one rank."""
    if get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
