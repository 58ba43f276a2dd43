"""The attention layer models use; the attention backend named in the batch does the work."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from radixserve.layers.rotary_embedding import RotaryEmbedding
    from radixserve.model_executor.forward_batch import ForwardBatch


class RadixAttention(nn.Module):
    """Attention over the paged KV cache.

    q: [num_tokens, num_heads * head_dim]; k, v: [num_tokens, num_kv_heads * head_dim]
    (the heads local to this tensor-parallel rank). Writes k and v into the KV cache at the
    batch's `out_cache_loc`, then attends over each request's prefix plus its new tokens
    (causal). Returns [num_tokens, num_heads * head_dim].

    `sliding_window` (Gemma's local layers): a token sees only the last that many positions, its
    own included (transformers' `sliding_window`); None sees them all. `logit_cap` (Gemma 2):
    scores become cap * tanh(score / cap) before the softmax. Every backend honours both.
    """

    def __init__(
        self,
        layer_id: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scaling: float,
        sliding_window: int | None = None,
        logit_cap: float | None = None,
    ) -> None:
        super().__init__()
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be at least 1, got {sliding_window}")
        if logit_cap is not None and logit_cap <= 0:
            raise ValueError(f"logit_cap must be positive, got {logit_cap}")
        self.layer_id = layer_id
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scaling = scaling
        self.sliding_window = sliding_window
        self.logit_cap = logit_cap

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        return forward_batch.attn_backend.forward(q, k, v, self, forward_batch)

    def forward_with_rope(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        positions: torch.Tensor,
        rotary: RotaryEmbedding,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        """RoPE, KV store and attention in the backend's fused kernels (when it fuses_rope);
        q and k are rotated in place."""
        backend = forward_batch.attn_backend
        return backend.forward_with_rope(q, k, v, positions, rotary, self, forward_batch)
