"""--enable-eplb: every --eplb-rebalance-num-iterations forward passes, recompute each MoE
layer's placement from the load it saw since the last time (placement.rebalance) and move the
experts' weights there (expert_moves.py), --eplb-rebalance-layers-per-chunk layers per forward
pass. As SGLang: skipped when the layers' average balancedness (mean over max of the EP ranks'
load) is already above --eplb-min-rebalancing-utilization-threshold.

Runs on every TP rank after each forward pass; the counts, and so every decision, are the
same on all of them (the router is replicated), so the moves' collectives pair up.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from radixserve.distributed import parallel_state as ps
from radixserve.layers.moe import expert_stats
from radixserve.layers.moe.expert_moves import move_layer
from radixserve.layers.moe.fused_moe import FusedMoE
from radixserve.layers.moe.placement import LayerPlacement, rebalance, utilization

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EPLBConfig:
    rebalance_num_iterations: int
    layers_per_chunk: int | None  # None: every layer in the pass that decides
    min_utilization_threshold: float


@dataclass(frozen=True)
class PlannedMove:
    layer_id: int
    placement: LayerPlacement
    before: float  # the layer's balancedness over the window, as placed
    after: float  # the same load under the new placement


def plan(
    layers: dict[int, FusedMoE], loads: dict[int, torch.Tensor], threshold: float
) -> list[PlannedMove] | None:
    """The layers whose placement changes for `loads` (layer id -> [logical] counts); None when
    the average balancedness is above `threshold` (nothing worth moving)."""
    moves = []
    current = []
    for layer_id, layer in sorted(layers.items()):
        load = loads.get(layer_id)
        if load is None or float(load.sum()) == 0:
            continue
        before = utilization(load, layer.placement)
        current.append(before)
        new = rebalance(load, layer.num_physical_experts, layer.ep_size, layer.placement)
        if new != layer.placement:
            moves.append(PlannedMove(layer_id, new, before, utilization(load, new)))
    if current and sum(current) / len(current) > threshold:
        logger.info(
            "EPLB: skipped rebalancing: balancedness %.3f > --eplb-min-rebalancing-utilization-"
            "threshold %.3f",
            sum(current) / len(current),
            threshold,
        )
        return None
    return moves


class EPLBManager:
    """Counts forward passes and rebalances the model's MoE layers."""

    def __init__(self, layers: dict[int, FusedMoE], config: EPLBConfig) -> None:
        self.layers = layers
        self.config = config
        self.counts = expert_stats.ExpertCounts()
        expert_stats.set_eplb_counts(self.counts)
        self.passes = 0
        self.rebalances = 0  # rebalances decided (moves planned)
        self.layers_moved = 0
        self._pending: list[PlannedMove] = []
        self._log = logger.info if ps.get_tp_rank() == 0 else logger.debug
        self._log(
            "EPLB: %d MoE layers, rebalanced every %d forward passes",
            len(layers),
            config.rebalance_num_iterations,
        )

    def close(self) -> None:
        expert_stats.set_eplb_counts(None)

    def on_forward_pass_end(self) -> None:
        self.passes += 1
        if self.passes % self.config.rebalance_num_iterations == 0:
            self._decide()
        if self._pending:
            self._move_chunk()

    def _decide(self) -> None:
        loads = self.counts.snapshot()
        self.counts.clear()  # the next window starts now
        moves = plan(self.layers, loads, self.config.min_utilization_threshold)
        if moves is None:
            return
        self.rebalances += 1
        self._pending = moves
        if not moves:
            self._log("EPLB: rebalance after %d passes: every layer already placed", self.passes)

    def _move_chunk(self) -> None:
        size = self.config.layers_per_chunk or len(self._pending)
        chunk, self._pending = self._pending[:size], self._pending[size:]
        sent = 0
        for move in chunk:
            sent += move_layer(self.layers[move.layer_id], move.placement)
        self.layers_moved += len(chunk)
        self._log(
            "EPLB: moved layers %s (%d expert copies sent); balancedness %s -> %s%s",
            [m.layer_id for m in chunk],
            sent,
            _fmt([m.before for m in chunk]),
            _fmt([m.after for m in chunk]),
            f", {len(self._pending)} layers left for the next passes" if self._pending else "",
        )


def _fmt(values: list[float]) -> str:
    return f"{sum(values) / len(values):.3f}" if values else "-"
