"""Joining the pipeline-parallel layout once the world group exists: one TP group per stage
(every rank takes part in creating every group, as torch.distributed requires), and this
rank's stage recorded in parallel_state."""

from __future__ import annotations

import logging

import torch.distributed as dist

from radixserve.distributed import parallel_state as ps
from radixserve.distributed.pipeline_layout import PipelineLayout

logger = logging.getLogger(__name__)


def join_pipeline_groups(tp_size: int, pp_size: int, rank: int) -> PipelineLayout:
    layout = PipelineLayout(tp_size, pp_size)
    stage = layout.stage_of(rank)
    for s in range(pp_size):
        group = dist.new_group(layout.stage_ranks(s))
        if s == stage:
            ps.set_tp_group(group)
    ps.set_pp(stage, pp_size)
    logger.info(
        "Rank %d: pipeline stage %d of %d, TP rank %d of %d",
        rank,
        stage,
        pp_size,
        layout.tp_rank_of(rank),
        tp_size,
    )
    return layout
