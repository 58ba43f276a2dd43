"""The attention layer models use; the attention backend named in the batch does the work."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from radixserve.distributed import parallel_state as ps
from radixserve.layers.linear import copy_checked

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

    `sinks` (gpt-oss): a learned logit per head that joins each query's softmax denominator
    (an "attention sink" that takes probability mass but adds no value), held as the parameter
    `sinks` [this rank's heads] in float32. Every backend honours it: torch_native on the
    PyTorch reference (kernels/reference.attention, SDPA has no sink term), intel_amx in the C++
    kernel (ops.paged_attention), which adds it to the online softmax's denominator.
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
        sinks: bool = False,
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
        self.sinks: nn.Parameter | None = None
        if sinks:
            # float32 whatever the model dtype: a 16-bit checkpoint's values widen exactly,
            # and the softmax they join runs in float32.
            self.sinks = nn.Parameter(
                torch.zeros(num_heads, dtype=torch.float32), requires_grad=False
            )
            self.sinks.weight_loader = self._load_sinks

    def _load_sinks(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        """This rank's heads of the checkpoint's sinks [all heads] (heads split as q's are)."""
        start = ps.get_tp_rank() * self.num_heads
        copy_checked(param.data, loaded_weight.narrow(0, start, self.num_heads))

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
