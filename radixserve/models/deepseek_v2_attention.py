"""Multi-head latent attention (MLA), DeepSeek-V2's attention, over the compressed KV cache.

Each token's keys and values are compressed to one latent vector c (kv_lora_rank dims, after
kv_a_layernorm) plus one rotated key k_pe (qk_rope_head_dim dims) shared by all heads; the
per-head keys and values are kv_b_proj's expansion of c: k_nope_h = W_UK_h c, v_h = W_UV_h c.
The KV cache stores only [c, k_pe] (models/kv_layout.py), one "head" per token.

Attention runs on that form with kv_b_proj absorbed ("weight absorption"): the score of head h
is q_nope_h . W_UK_h c + q_pe_h . k_pe = (W_UK_h^T q_nope_h) . c + q_pe_h . k_pe, so each head's
query becomes [W_UK_h^T q_nope_h, q_pe_h] over the cached row, an ordinary multi-query
attention with one KV head whose value is the same row; the latent part of each head's output,
times W_UV_h, is that head's value output. Any attention backend runs it unchanged (extend and
decode alike, so prefix reuse and chunked prefill see the same cache rows).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from radixserve.layers.layernorm import RMSNorm
from radixserve.layers.linear import ReplicatedLinear, copy_checked
from radixserve.layers.radix_attention import RadixAttention

if TYPE_CHECKING:
    from radixserve.layers.rotary_embedding import RotaryEmbedding
    from radixserve.model_executor.forward_batch import ForwardBatch
    from radixserve.models.config import ModelConfig

logger = logging.getLogger(__name__)

# DeepSeek's q_a_layernorm and kv_a_layernorm keep their own epsilon, not rms_norm_eps.
_LATENT_NORM_EPS = 1e-6


def mla_softmax_scale(qk_head_dim: int, rope_scaling: dict | None) -> float:
    """qk_head_dim ** -0.5, times YaRN's mscale(factor, mscale_all_dim) squared where the
    config's YaRN sets mscale_all_dim: DeepSeek scales the whole score (not only the rotated
    dims, which the RoPE table's attention factor already scales)."""
    scale = qk_head_dim**-0.5
    params = rope_scaling or {}
    if params.get("rope_type", params.get("type", "default")) in ("default", None):
        return scale
    mscale_all_dim = params.get("mscale_all_dim") or 0
    factor = float(params.get("factor", 1.0))
    if mscale_all_dim and factor > 1:
        mscale = 0.1 * float(mscale_all_dim) * math.log(factor) + 1.0
        scale *= mscale * mscale
    return scale


class LatentExpansion(nn.Module):
    """kv_b_proj's weight [heads * (qk_nope + v), kv_lora_rank], kept as a plain tensor: MLA
    never applies it as a linear layer, it folds its two halves into the query and output."""

    def __init__(self, num_heads: int, nope_dim: int, v_dim: int, kv_lora_rank: int) -> None:
        super().__init__()
        self.num_heads, self.nope_dim, self.v_dim = num_heads, nope_dim, v_dim
        rows = num_heads * (nope_dim + v_dim)
        self.weight = nn.Parameter(torch.empty(rows, kv_lora_rank), requires_grad=False)
        self.weight.weight_loader = self._load

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        copy_checked(param.data, loaded)

    def halves(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_UK [heads, qk_nope, latent], W_UV [heads, v, latent])."""
        per_head = self.weight.view(self.num_heads, self.nope_dim + self.v_dim, -1)
        return per_head[:, : self.nope_dim], per_head[:, self.nope_dim :]


class MultiHeadLatentAttention(nn.Module):
    """DeepSeek-V2's self_attn, with transformers' parameter names (q_proj or
    q_a_proj/q_a_layernorm/q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj).
    `rotary_emb` must rotate interleaved pairs (DeepSeek's complex-number RoPE) over
    qk_rope_head_dim dims."""

    def __init__(self, config: ModelConfig, layer_id: int, rotary_emb: RotaryEmbedding) -> None:
        super().__init__()
        hf = config.hf_config
        hidden = config.hidden_size
        bias = bool(getattr(hf, "attention_bias", False))
        self.num_heads = int(hf.num_attention_heads)
        self.nope_dim = int(hf.qk_nope_head_dim)
        self.rope_dim = int(hf.qk_rope_head_dim)
        self.v_dim = int(hf.v_head_dim)
        self.kv_lora_rank = int(hf.kv_lora_rank)
        self.q_lora_rank = getattr(hf, "q_lora_rank", None)
        qk_head_dim = self.nope_dim + self.rope_dim
        q_width = self.num_heads * qk_head_dim
        self.q_proj: ReplicatedLinear | None = None
        self.q_a_proj: ReplicatedLinear | None = None
        self.q_a_layernorm: RMSNorm | None = None
        self.q_b_proj: ReplicatedLinear | None = None
        # Replicated on every tensor-parallel rank: the heads are not split (each rank computes
        # the whole attention; only the MLPs are sharded).
        if self.q_lora_rank is None:
            self.q_proj = ReplicatedLinear(hidden, q_width)
        else:
            rank = int(self.q_lora_rank)
            self.q_a_proj = ReplicatedLinear(hidden, rank, bias=bias)
            self.q_a_layernorm = RMSNorm(rank, _LATENT_NORM_EPS)
            self.q_b_proj = ReplicatedLinear(rank, q_width)
        self.kv_a_proj_with_mqa = ReplicatedLinear(
            hidden, self.kv_lora_rank + self.rope_dim, bias=bias
        )
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, _LATENT_NORM_EPS)
        self.kv_b_proj = LatentExpansion(
            self.num_heads, self.nope_dim, self.v_dim, self.kv_lora_rank
        )
        self.o_proj = ReplicatedLinear(self.num_heads * self.v_dim, hidden, bias=bias)
        self.rotary_emb = rotary_emb
        row = self.kv_lora_rank + self.rope_dim
        # One KV head of the cached row's width; the value is that row too (its latent part
        # is what the output keeps).
        self.attn = RadixAttention(
            layer_id, self.num_heads, 1, row, mla_softmax_scale(qk_head_dim, config.rope_scaling)
        )

    def _query(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.q_proj is not None:
            return self.q_proj(hidden)
        assert self.q_a_proj is not None and self.q_a_layernorm is not None
        assert self.q_b_proj is not None
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden)))

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        tokens = hidden.shape[0]
        q = self._query(hidden).view(tokens, self.num_heads, self.nope_dim + self.rope_dim)
        q_nope, q_pe = q.split([self.nope_dim, self.rope_dim], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(hidden).split(
            [self.kv_lora_rank, self.rope_dim], dim=-1
        )
        latent = self.kv_a_layernorm(latent.contiguous())
        q_pe, k_pe = self.rotary_emb(
            positions, q_pe.reshape(tokens, -1), k_pe.contiguous().reshape(tokens, -1)
        )
        w_uk, w_uv = self.kv_b_proj.halves()
        # Absorb W_UK into the query: [T, H, nope] x [H, nope, latent] -> [T, H, latent].
        q_latent = torch.einsum("thn,hnl->thl", q_nope, w_uk.to(q_nope.dtype))
        q_full = torch.cat([q_latent, q_pe.view(tokens, self.num_heads, self.rope_dim)], dim=-1)
        row = torch.cat([latent, k_pe], dim=-1)  # the cache row: [T, latent + rope]
        # V shares K's buffer in the pool; the backend is handed the row for both.
        out = self.attn(q_full.reshape(tokens, -1), row, row, forward_batch)
        out_latent = out.view(tokens, self.num_heads, -1)[..., : self.kv_lora_rank]
        # Then W_UV on the way out: [T, H, latent] x [H, v, latent] -> [T, H, v].
        values = torch.einsum("thl,hvl->thv", out_latent, w_uv.to(out_latent.dtype))
        return self.o_proj(values.reshape(tokens, -1))
