"""The attention backend interface: faster backends plug in behind it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

from radixserve.layers.attention.bidirectional import recompute_block_rows

if TYPE_CHECKING:
    from radixserve.layers.radix_attention import RadixAttention
    from radixserve.model_executor.forward_batch import ForwardBatch


class AttentionBackend(ABC):
    """Stores new K/V into the cache and computes attention for one layer of a batch."""

    # True when the backend offers forward_with_rope (RoPE + KV store + attention fused).
    fuses_rope = False

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:  # noqa: B027
        """Precompute per-batch metadata once, before the layers run. Optional."""

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        num_tokens = q.shape[0]
        q = q.view(num_tokens, layer.num_heads, layer.head_dim)
        k = k.view(num_tokens, layer.num_kv_heads, layer.head_dim)
        v = v.view(num_tokens, layer.num_kv_heads, layer.head_dim)
        forward_batch.kv_cache.set_kv(layer.layer_id, forward_batch.out_cache_loc, k, v)
        if forward_batch.forward_mode.is_decode:
            out = self.forward_decode(q, layer, forward_batch)
        else:
            out = self.forward_extend(q, layer, forward_batch)
        out = out.reshape(num_tokens, layer.num_heads * layer.head_dim)
        if forward_batch.bidirectional_blocks:
            # Image tokens that see each other both ways (Gemma 3): those requests' rows again.
            out = recompute_block_rows(out, q.reshape(num_tokens, -1), layer, forward_batch)
        return out

    @abstractmethod
    def forward_extend(
        self, q: torch.Tensor, layer: RadixAttention, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        """q: [num_tokens, heads, dim] -> [num_tokens, heads, dim]; KV already stored."""

    @abstractmethod
    def forward_decode(
        self, q: torch.Tensor, layer: RadixAttention, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        """q: [batch, heads, dim] (one token per request) -> [batch, heads, dim]."""
