"""Multimodal RoPE (Qwen2-VL, Qwen2.5-VL): every token has three positions (temporal, height,
width) and the rotary frequencies are split into `mrope_section` runs, the first run rotating by
the temporal position, the next by the height, the last by the width (the same split for the
cos and the sin half).

A text token's three positions are equal, so its rotation is the plain RoPE row of that
position. Only image tokens, whose positions differ, need rows of their own: the table keeps
`max_position` scratch rows after its plain rows, and each step writes its image tokens' mixed
rows there (one per distinct (t, h, w) triple) and hands those row numbers to the kernels. Every
kernel that rotates reads cos/sin rows by index from this one tensor (captured once by the fused
layer), so they all apply M-RoPE without knowing of it; the table is written in place, never
reallocated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from radixserve.layers.rotary_embedding import RotaryEmbedding

if TYPE_CHECKING:
    from radixserve.model_executor.forward_batch import ForwardBatch


def section_axes(mrope_section: Sequence[int], rotary_dim: int) -> torch.Tensor:
    """For each of the rotary_dim / 2 frequencies, the axis (0 t, 1 h, 2 w) whose position
    rotates it."""
    if len(mrope_section) != 3 or any(int(s) < 0 for s in mrope_section):
        raise ValueError(f"mrope_section must be three sizes, got {list(mrope_section)}")
    if sum(int(s) for s in mrope_section) != rotary_dim // 2:
        raise ValueError(
            f"mrope_section {list(mrope_section)} must sum to rotary_dim / 2 = {rotary_dim // 2}"
        )
    return torch.repeat_interleave(torch.arange(3), torch.tensor([int(s) for s in mrope_section]))


class MRotaryEmbedding(RotaryEmbedding):
    """cos_sin_cache is [plain rows; scratch rows]: rows below `max_position` are plain RoPE by
    position, the rest hold this step's image tokens' mixed rows. Positions come as [T] (every
    axis equal) or [3, T]."""

    def __init__(
        self,
        head_dim: int,
        rotary_dim: int,
        max_position: int,
        base: float,
        mrope_section: Sequence[int],
        rope_scaling: Mapping[str, Any] | None = None,
        original_max_position: int | None = None,
    ) -> None:
        self.axes = section_axes(mrope_section, rotary_dim)
        super().__init__(
            head_dim, rotary_dim, max_position, base, rope_scaling, original_max_position
        )

    def _build_table(
        self, base: float, rope_scaling: Mapping[str, Any] | None, original_max_position: int
    ) -> torch.Tensor:
        plain = super()._build_table(base, rope_scaling, original_max_position)
        # One scratch row per image token a step may hold: the scheduler keeps an M-RoPE
        # model's prefill steps within the context length (managers/image_chunking.py's
        # mrope_step_limits), which max_position is.
        return torch.cat([plain, torch.zeros_like(plain)])

    def mixed_rows(self, positions: torch.Tensor) -> torch.Tensor:
        """[3, N] positions -> their M-RoPE cos/sin rows [N, rotary_dim] (float32)."""
        table = self.cos_sin_cache[: self.max_position]
        half = self.rotary_dim // 2
        axes = self.axes.to(positions.device)
        freq = torch.arange(half, device=positions.device)
        # For frequency i, row positions[axes[i]] of the plain table, column i (cos) and
        # half + i (sin).
        picked = positions[axes]  # [half, N]
        cos = table[picked, freq[:, None]]
        sin = table[picked, (freq + half)[:, None]]
        return torch.cat([cos.T, sin.T], dim=-1)

    def table_rows(self, positions: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        if positions.dim() == 1:
            return positions
        if positions.dim() != 2 or positions.shape[0] != 3:
            raise ValueError(f"M-RoPE positions must be [3, tokens], got {tuple(positions.shape)}")
        if positions.numel() and int(positions.max()) >= self.max_position:
            raise ValueError(f"an M-RoPE position reaches the table's end ({self.max_position})")
        rows = positions[0].clone()
        mixed = (positions[0] != positions[1]) | (positions[0] != positions[2])
        if not bool(mixed.any()):
            return rows
        triples, which = torch.unique(positions[:, mixed], dim=1, return_inverse=True)
        if triples.shape[1] > self.max_position:
            raise ValueError(
                f"a step holds {triples.shape[1]} image positions; at most {self.max_position}"
            )
        values = self.mixed_rows(triples).to(self.cos_sin_cache.dtype)
        self.cos_sin_cache[self.max_position : self.max_position + triples.shape[1]] = values
        rows[mixed] = which + self.max_position
        return rows
