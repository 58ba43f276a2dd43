"""--enable-return-routed-experts: the top-k expert ids every MoE layer chose for every row of
one forward step, for the requests that asked for them (`return_routed_experts`).

The model runner opens a capture around a step only when some request of the step asked
(StepInputs.capture_routing); FusedMoE.forward reports its routing here, as it reports to
expert_stats.py. The one-call C++ layers (the layer chain and its single-row path) route inside
C++ and report nothing, so while a capture is open they step aside and the layers run module
by module: the same routing arithmetic (layers/moe/router.py), only slower, and only for the
steps that need it.

One capture per process (module state, as expert_stats.py): the forward runs on one thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import nn

# The id of a (token, layer, slot) no expert was routed to: dense layers of a model with some
# dense layers, and the slots past a layer's own top_k where layers differ.
NO_EXPERT = -1


class RoutedShape(NamedTuple):
    """The per-token block of ids: [num_layers, top_k]."""

    num_layers: int
    top_k: int


class StepCapture:
    """The ids of one forward step: [rows, num_layers, top_k] int32, NO_EXPERT where nothing
    was routed."""

    def __init__(self, num_rows: int, shape: RoutedShape) -> None:
        self.ids = torch.full(
            (num_rows, shape.num_layers, shape.top_k), NO_EXPERT, dtype=torch.int32
        )

    def observe(self, layer_id: int, experts: torch.Tensor) -> None:
        if layer_id >= self.ids.shape[1]:
            return  # a MoE layer past the decoder's (none today): no column to report it in
        # Rows past the step's own (padding) are not any request's; ids land on the CPU here,
        # once per layer, which is the capture's cost.
        rows = min(experts.shape[0], self.ids.shape[0])
        k = min(experts.shape[1], self.ids.shape[2])
        self.ids[:rows, layer_id, :k] = experts[:rows, :k].to("cpu", torch.int32)


_ACTIVE: StepCapture | None = None


def capturing() -> bool:
    """Whether a step's routing is being captured (the C++ layers step aside meanwhile)."""
    return _ACTIVE is not None


def observe(layer_id: int, experts: torch.Tensor) -> None:
    """A MoE layer routed its rows to `experts` [tokens, top_k] (global ids)."""
    if _ACTIVE is not None:
        _ACTIVE.observe(layer_id, experts)


@contextlib.contextmanager
def capture_step(num_rows: int, shape: RoutedShape) -> Iterator[StepCapture]:
    """Capture the routing of the forward run inside the block; closed even if it raises."""
    global _ACTIVE
    capture = StepCapture(num_rows, shape)
    _ACTIVE = capture
    try:
        yield capture
    finally:
        _ACTIVE = None


def routed_shape(model: nn.Module, num_layers: int) -> RoutedShape | None:
    """[num_layers, largest top_k] for `model` (its MoE layers numbered by
    expert_stats.attach), or None when it has no MoE layer to report."""
    from radixserve.layers.moe.fused_moe import FusedMoE

    top_ks = [
        m.router.top_k
        for m in model.modules()
        if isinstance(m, FusedMoE) and m.layer_id is not None
    ]
    if not top_ks:
        return None
    return RoutedShape(num_layers, max(top_ks))
