"""--expert-distribution-recorder-mode stat: how many (token, slot) routings each expert of each
MoE layer received while recording was on, summed over forward passes.

One recorder per process (module state, as parallel_state is): the MoE layers report their
routing here and the scheduler's control calls start, stop and dump it. The router is
replicated on every TP rank, so rank 0's counts are the whole model's.
"""

from __future__ import annotations

import re
import threading

import torch
from torch import nn

RECORDER_MODES = ("stat",)


class ExpertCounts:
    """Per-layer, per-expert routing counts: [layers, experts] int64, grown as layers report."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the HTTP thread reads while the model thread adds
        self._counts: dict[int, torch.Tensor] = {}

    def add(self, layer_id: int, experts: torch.Tensor, num_experts: int) -> None:
        # Counted where the ids are (one small copy back, not the ids themselves).
        counts = torch.bincount(experts.reshape(-1), minlength=num_experts).cpu()
        with self._lock:
            held = self._counts.get(layer_id)
            self._counts[layer_id] = counts if held is None else held + counts

    def clear(self) -> None:
        with self._lock:
            self._counts.clear()

    def snapshot(self) -> dict[int, torch.Tensor]:
        """Each reported layer's counts (copies), by layer id."""
        with self._lock:
            return {layer: c.clone() for layer, c in sorted(self._counts.items())}

    def matrix(self) -> torch.Tensor:
        """[layers, experts] with a zero row for layers that never reported (dense layers), as
        SGLang's `logical_count`; [0, 0] before any layer reported."""
        snap = self.snapshot()
        if not snap:
            return torch.zeros(0, 0, dtype=torch.int64)
        width = max(c.numel() for c in snap.values())
        out = torch.zeros(max(snap) + 1, width, dtype=torch.int64)
        for layer, counts in snap.items():
            out[layer, : counts.numel()] = counts
        return out


_COUNTS = ExpertCounts()
_RECORDING = False
# --enable-eplb's own window of counts (eplb.py), fed whatever the recorder does: the
# recorder's start / stop / dump belong to the user and would reset or stop it.
_EPLB_COUNTS: ExpertCounts | None = None


def set_eplb_counts(counts: ExpertCounts | None) -> None:
    global _EPLB_COUNTS
    _EPLB_COUNTS = counts


def recording() -> bool:
    """Whether routings are being counted (the one-call C++ layer steps aside meanwhile: it
    routes inside C++ and reports nothing)."""
    return _RECORDING


def start() -> None:
    """Start counting from zero (SGLang's start_expert_distribution_record resets too)."""
    global _RECORDING
    _COUNTS.clear()
    _RECORDING = True


def stop() -> None:
    global _RECORDING
    _RECORDING = False


def counts() -> ExpertCounts:
    return _COUNTS


def observe(layer_id: int, experts: torch.Tensor, num_experts: int) -> None:
    """A MoE layer routed its rows to `experts` [tokens, top_k] (logical ids: the router's,
    before any redundant copy is chosen)."""
    if _RECORDING:
        _COUNTS.add(layer_id, experts, num_experts)
    if _EPLB_COUNTS is not None:
        _EPLB_COUNTS.add(layer_id, experts, num_experts)


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def attach(model: nn.Module) -> int:
    """Give each FusedMoE of `model` its decoder layer's index, so it reports under it; the
    number of MoE layers found."""
    from radixserve.layers.moe.fused_moe import FusedMoE

    found = 0
    for name, module in model.named_modules():
        match = _LAYER.search(name)
        if isinstance(module, FusedMoE) and match is not None:
            module.layer_id = int(match.group(1))
            found += 1
    return found
