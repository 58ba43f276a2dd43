"""Rotary position embedding with a precomputed cos/sin table, looked up by position.

Supported rope_scaling types: default, linear, dynamic (NTK), llama3, yarn, and longrope
(layers/longrope.py). Frequencies are computed in float32 the way the Hugging Face reference
does, so float32 outputs match it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from radixserve.model_executor.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")


def rope_type_of(rope_scaling: Mapping[str, Any] | None) -> str:
    if not rope_scaling:
        return "default"
    return str(rope_scaling.get("rope_type") or rope_scaling.get("type") or "default")


def _base_inv_freq(base: float, rotary_dim: int) -> torch.Tensor:
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(torch.float32) / rotary_dim
    return 1.0 / (base**exponents)


def _llama3_inv_freq(base: float, rotary_dim: int, params: Mapping[str, Any]) -> torch.Tensor:
    inv_freq = _base_inv_freq(base, rotary_dim)
    factor = float(params["factor"])
    low_factor = float(params.get("low_freq_factor", 1.0))
    high_factor = float(params.get("high_freq_factor", 4.0))
    old_len = float(params["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths (low frequencies) are slowed down by `factor`, short ones are kept, and the
    # band in between is interpolated smoothly.
    scaled = torch.where(wavelen > old_len / low_factor, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low_factor) / (high_factor - low_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    in_band = ~(wavelen < old_len / high_factor) * ~(wavelen > old_len / low_factor)
    return torch.where(in_band, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(
    base: float, rotary_dim: int, params: Mapping[str, Any], max_position: int
) -> tuple[torch.Tensor, float]:
    """YaRN: interpolate low frequencies, extrapolate high ones, ramp between; scale cos/sin."""
    original = int(params.get("original_max_position_embeddings") or max_position)
    factor = float(params.get("factor") or max_position / original)
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast = float(params.get("beta_fast") or 32)
    beta_slow = float(params.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:
        return rotary_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, rotary_dim, 2).to(torch.float32) / rotary_dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    keep = 1 - ramp
    return interpolation * (1 - keep) + extrapolation * keep, float(attention_factor)


def compute_inv_freq(
    base: float,
    rotary_dim: int,
    rope_scaling: Mapping[str, Any] | None,
    original_max_position: int,
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [rotary_dim / 2] and the cos/sin scale for a rope_scaling config."""
    rope_type = rope_type_of(rope_scaling)
    params = rope_scaling or {}
    if rope_type == "default":
        return _base_inv_freq(base, rotary_dim), 1.0
    if rope_type == "linear":
        return _base_inv_freq(base, rotary_dim) / float(params["factor"]), 1.0
    if rope_type == "dynamic":
        # One fixed base sized for the longest sequence (as SGLang does): a base that changed
        # with the sequence length would invalidate keys already in the KV cache.
        factor = float(params["factor"])
        longest = factor * original_max_position
        growth = factor * longest / original_max_position - (factor - 1)
        scaled_base = base * growth ** (rotary_dim / (rotary_dim - 2))
        return _base_inv_freq(scaled_base, rotary_dim), 1.0
    if rope_type == "llama3":
        return _llama3_inv_freq(base, rotary_dim, params), 1.0
    if rope_type == "yarn":
        return _yarn_inv_freq(base, rotary_dim, params, original_max_position)
    if rope_type == "longrope":
        raise ValueError("longrope has two sets of frequencies; build it with get_rope")
    raise ValueError(
        f"rope_scaling type {rope_type!r} is not supported; supported: "
        f"{', '.join(SUPPORTED_ROPE_TYPES)}"
    )


class RotaryEmbedding(nn.Module):
    """Applies RoPE to q and k by position, from a float32 cos/sin table of `max_position` rows.

    neox style (Llama/Qwen HF checkpoints) rotates the two halves of the rotary dims; the GPT-J
    style rotates interleaved pairs. Only the first `rotary_dim` dims of each head rotate.
    Tokens read the table's rows by `table_rows` (their positions here; a subclass may keep
    several tables in one, as LongRoPE does), and every kernel that rotates reads rows that way.
    """

    def __init__(
        self,
        head_dim: int,
        rotary_dim: int,
        max_position: int,
        base: float,
        rope_scaling: Mapping[str, Any] | None = None,
        original_max_position: int | None = None,
        is_neox_style: bool = True,
    ) -> None:
        super().__init__()
        if rotary_dim > head_dim or rotary_dim % 2:
            raise ValueError(f"rotary_dim {rotary_dim} must be even and at most {head_dim}")
        if max_position <= 0:
            raise ValueError(f"max_position must be positive, got {max_position}")
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim
        self.max_position = max_position
        self.is_neox_style = is_neox_style
        cache = self._build_table(base, rope_scaling, original_max_position or max_position)
        # Non-persistent: derived from the config, never part of a checkpoint.
        self.register_buffer("cos_sin_cache", cache.to(torch.float32), persistent=False)

    def _build_table(
        self, base: float, rope_scaling: Mapping[str, Any] | None, original_max_position: int
    ) -> torch.Tensor:
        """The float32 cos/sin table, [max_position, rotary_dim] (cos half, then sin half)."""
        inv_freq, scale = compute_inv_freq(
            base, self.rotary_dim, rope_scaling, original_max_position
        )
        return cos_sin_table(inv_freq, scale, self.max_position)

    def table_rows(self, positions: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        """The rows of cos_sin_cache that rotate tokens at `positions` in this batch: the
        positions themselves (models look rows up once per forward and pass them where
        positions go; positions serve nothing but the RoPE lookup)."""
        return positions

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        num_tokens = x.shape[0]
        x = x.view(num_tokens, -1, self.head_dim)
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        if self.is_neox_style:
            x1, x2 = rot.chunk(2, dim=-1)
        else:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out1 = x1 * cos - x2 * sin
        out2 = x2 * cos + x1 * sin
        if self.is_neox_style:
            rotated = torch.cat([out1, out2], dim=-1)
        else:
            rotated = torch.stack([out1, out2], dim=-1).flatten(-2)
        return torch.cat([rotated, rest], dim=-1).reshape(num_tokens, -1)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T]; q [T, H * head_dim]; k [T, Hkv * head_dim] -> rotated (q, k)."""
        cos_sin = self.cos_sin_cache[positions].to(q.dtype)
        cos, sin = cos_sin.unsqueeze(1).chunk(2, dim=-1)  # [T, 1, rotary_dim / 2] each
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)


def cos_sin_table(inv_freq: torch.Tensor, scale: float, rows: int) -> torch.Tensor:
    """[rows, 2 * len(inv_freq)]: cos then sin of position x frequency, times `scale`."""
    positions = torch.arange(rows, dtype=torch.float32, device=inv_freq.device)
    freqs = positions[:, None] * inv_freq[None, :]
    return torch.cat([freqs.cos() * scale, freqs.sin() * scale], dim=-1)


def get_rope(
    head_dim: int,
    rotary_dim: int,
    max_position: int,
    base: float,
    rope_scaling: Mapping[str, Any] | None = None,
    original_max_position: int | None = None,
    is_neox_style: bool = True,
) -> RotaryEmbedding:
    """Build the rotary embedding for a model; one instance is shared by all its layers.
    `original_max_position` is the model's own max_position_embeddings (`max_position` may be
    the shorter or longer serving context)."""
    if rope_type_of(rope_scaling) == "longrope":
        # Imported here: longrope.py builds on this module's RotaryEmbedding.
        from radixserve.layers.longrope import LongRopeEmbedding

        assert rope_scaling is not None
        return LongRopeEmbedding(
            head_dim,
            rotary_dim,
            max_position,
            base,
            rope_scaling,
            model_max_position=original_max_position or max_position,
            is_neox_style=is_neox_style,
        )
    return RotaryEmbedding(
        head_dim,
        rotary_dim,
        max_position,
        base,
        rope_scaling=rope_scaling,
        original_max_position=original_max_position,
        is_neox_style=is_neox_style,
    )
