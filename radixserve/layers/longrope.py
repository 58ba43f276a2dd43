"""LongRoPE ("longrope" rope_scaling: Phi-3 128k, Phi-3.5, Phi-4-mini).

The checkpoint carries two sets of per-frequency stretch factors: short_factor for sequences
within the pretraining length (original_max_position_embeddings), long_factor beyond it. Hugging
Face rotates a whole sequence with one set, chosen by its length: a prompt longer than the
pretraining length is computed with the long set throughout, and when generation grows a
sequence past it, Phi-3's generate() drops the cache and recomputes every position with the
long set.

Here both tables live in one cos/sin buffer, short rows first, and `table_rows` picks a row per
token by the same rule applied per request (its length after this step), so a batch gives each
request what it would get alone, and the fused kernels, which read cos/sin rows by index, need
nothing new. What a KV cache cannot redo is the recompute: a sequence that grows past the
pretraining length keeps its earlier positions' short-set keys and rotates only new tokens with
the long set (as SGLang and vLLM do), and likewise a prompt prefilled in chunks rotates its first
chunks with the short set, and a prefix cached from a shorter request keeps its short rotation.
Outputs match Hugging Face's while a sequence stays within the pretraining length, and for a
prompt beyond it that is prefilled in one piece.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from radixserve.layers.rotary_embedding import RotaryEmbedding, cos_sin_table

if TYPE_CHECKING:
    from radixserve.model_executor.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)


def longrope_inv_freq(base: float, rotary_dim: int, factors: Sequence[float]) -> torch.Tensor:
    """Inverse frequencies [rotary_dim / 2] stretched by per-frequency `factors` (float32, in
    the reference implementation's order of operations, so float32 tables match it)."""
    if len(factors) != rotary_dim // 2:
        raise ValueError(
            f"longrope factors must have rotary_dim / 2 = {rotary_dim // 2} entries, "
            f"got {len(factors)}"
        )
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    return 1.0 / (torch.tensor(factors, dtype=torch.float32) * base**exponents)


def longrope_attention_factor(params: Mapping[str, Any], model_max_position: int) -> float:
    """The scale of cos and sin: given, else derived from how far the context was stretched
    (the model's max_position_embeddings over the pretraining length, unless `factor` says)."""
    given = params.get("attention_factor")
    if given is not None:
        return float(given)
    original = int(params["original_max_position_embeddings"])
    factor = float(params.get("factor") or model_max_position / original)
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original))


class LongRopeEmbedding(RotaryEmbedding):
    """cos_sin_cache is [short rows; long rows]: rows below `long_offset` hold the short-factor
    table for positions up to the pretraining length, rows from it the long-factor table for
    every position up to `max_position`."""

    def __init__(
        self,
        head_dim: int,
        rotary_dim: int,
        max_position: int,
        base: float,
        params: Mapping[str, Any],
        model_max_position: int,
        is_neox_style: bool = True,
    ) -> None:
        self.original_max_position = int(params["original_max_position_embeddings"])
        # A request uses short rows only while its length is within the pretraining length, so
        # the short table never needs more rows than that.
        self.long_offset = min(self.original_max_position, max_position)
        self._model_max_position = model_max_position
        super().__init__(
            head_dim, rotary_dim, max_position, base, params, model_max_position, is_neox_style
        )
        if max_position > self.original_max_position:
            logger.info(
                "LongRoPE: sequences longer than %d tokens rotate with the long factors; one "
                "that grows past that keeps its earlier keys (see layers/longrope.py)",
                self.original_max_position,
            )

    def _build_table(
        self, base: float, rope_scaling: Mapping[str, Any] | None, original_max_position: int
    ) -> torch.Tensor:
        params = rope_scaling or {}
        scale = longrope_attention_factor(params, self._model_max_position)
        short = longrope_inv_freq(base, self.rotary_dim, params["short_factor"])
        long = longrope_inv_freq(base, self.rotary_dim, params["long_factor"])
        return torch.cat(
            [
                cos_sin_table(short, scale, self.long_offset),
                cos_sin_table(long, scale, self.max_position),
            ]
        )

    def table_rows(self, positions: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        """Short rows for the tokens of requests no longer than the pretraining length after
        this step, long rows (position + long_offset) for the others."""
        limit = self.original_max_position
        if forward_batch.forward_mode.is_decode:
            # One token per request, at its last position: its length passes the limit exactly
            # when the position reaches it. Tensor-only, so a compiled decode graph stays static.
            return torch.where(positions >= limit, positions + self.long_offset, positions)
        lengths = forward_batch.seq_lens_cpu
        if max(lengths, default=0) <= limit:
            return positions
        if min(lengths) > limit:
            return positions + self.long_offset
        offsets = torch.tensor(
            [self.long_offset if n > limit else 0 for n in lengths], device=positions.device
        )
        counts = torch.tensor(forward_batch.extend_seq_lens_cpu, device=positions.device)
        return positions + torch.repeat_interleave(offsets, counts, output_size=len(positions))
