"""DeepSeek-V2 and DeepSeek-V2-Lite (DeepseekV2ForCausalLM): pre-norm layers with multi-head
latent attention (models/deepseek_v2_attention.py, a compressed KV cache) and, from layer
first_k_dense_replace on (every moe_layer_freq-th layer), a sparse MLP: n_routed_experts experts
of moe_intermediate_size, the top num_experts_per_tok of a softmax router per token (within the
topk_group best of n_group expert groups under "group_limited_greedy"), plus shared experts
(n_shared_experts x moe_intermediate_size wide, one MLP) every token goes through.

The routed weights follow DeepSeek's reference code: divided by their sum when norm_topk_prob
(and top_k > 1), else multiplied by routed_scaling_factor. transformers 5.25 always scales and
never renormalizes; the two agree on every published V2 / V2-Lite config (norm_topk_prob false).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

from radixserve.layers.layernorm import RMSNorm
from radixserve.layers.moe import RouterSpec
from radixserve.layers.rotary_embedding import RotaryEmbedding, get_rope
from radixserve.models.deepseek_v2_attention import MultiHeadLatentAttention
from radixserve.models.deepseek_v2_checkpoint import with_joined_kv_b
from radixserve.models.llama import LlamaForCausalLM, LlamaMLP, LlamaModel, input_norm
from radixserve.models.moe_common import MoEWeights, SparseMoeBlock
from radixserve.models.weight_utils import StackedParam

if TYPE_CHECKING:
    from radixserve.model_executor.forward_batch import ForwardBatch
    from radixserve.models.config import ModelConfig

logger = logging.getLogger(__name__)

_TOPK_METHODS = ("greedy", "group_limited_greedy")


def deepseek_router(hf_config: object) -> RouterSpec:
    """The RouterSpec of a DeepSeek-V2 config's gate."""
    method = getattr(hf_config, "topk_method", None) or "greedy"
    if method not in _TOPK_METHODS:
        # "noaux_tc" (V3's sigmoid router with a score correction bias) is V3's, not V2's.
        raise ValueError(f"DeepSeek-V2 topk_method {method!r} is not supported: {_TOPK_METHODS}")
    top_k = int(hf_config.num_experts_per_tok)
    renormalize = bool(getattr(hf_config, "norm_topk_prob", False)) and top_k > 1
    scale = 1.0 if renormalize else float(getattr(hf_config, "routed_scaling_factor", 1.0))
    groups, topk_groups = 1, 1
    if method == "group_limited_greedy":
        groups, topk_groups = int(hf_config.n_group), int(hf_config.topk_group)
    return RouterSpec(
        top_k,
        renormalize=renormalize,
        num_groups=groups,
        topk_groups=topk_groups,
        scaling_factor=scale,
    )


def is_moe_layer(hf_config: object, layer_id: int) -> bool:
    """DeepSeek's rule: experts from layer first_k_dense_replace on, every moe_layer_freq-th."""
    if not getattr(hf_config, "n_routed_experts", None):
        return False
    first = int(getattr(hf_config, "first_k_dense_replace", 0) or 0)
    freq = int(getattr(hf_config, "moe_layer_freq", 1) or 1)
    return layer_id >= first and layer_id % freq == 0


class DeepseekV2DecoderLayer(nn.Module):
    """Pre-norm MLA and MLP (dense or sparse), the residual stream carried apart as in Llama's
    layer (its norms fuse the add). Not a LlamaDecoderLayer: the one-call C++ layer knows
    standard attention only, so this layer never offers it."""

    def __init__(
        self, config: ModelConfig, layer_id: int, rotary_emb: RotaryEmbedding, mlp: nn.Module
    ) -> None:
        super().__init__()
        self.self_attn = MultiHeadLatentAttention(config, layer_id, rotary_emb)
        self.mlp = mlp
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        forward_batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, residual = input_norm(self.input_layernorm, hidden, residual)
        hidden = self.self_attn(positions, hidden, forward_batch)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class DeepseekV2Model(LlamaModel):
    """Llama's body; its layers rotate with DeepSeek's interleaved-pair RoPE over the
    qk_rope_head_dim dims (config.head_dim, as transformers sets it)."""

    def layer_rope(self, config: ModelConfig, layer_id: int) -> RotaryEmbedding:
        rope = getattr(self, "_interleaved_rope", None)
        if rope is None:
            # One table for all layers, read by position like the model's own (table_rows).
            rope = get_rope(
                config.head_dim,
                config.rotary_dim,
                max_position=config.context_len,
                base=config.rope_theta,
                rope_scaling=config.rope_scaling,
                original_max_position=config.max_position_embeddings,
                is_neox_style=False,
            )
            self._interleaved_rope = rope
        return rope


class DeepseekV2ForCausalLM(MoEWeights, LlamaForCausalLM):
    model_class = DeepseekV2Model
    # No fused q/k/v: MLA's projections load under their own names (V2-Lite's q_proj too).
    stacked_params = (
        StackedParam("gate_up_proj", "gate_proj", 0),
        StackedParam("gate_up_proj", "up_proj", 1),
    )
    # transformers names the shared MLP mlp.shared_experts; SparseMoeBlock's is shared_expert.
    module_renames = ((".mlp.shared_experts.", ".mlp.shared_expert."),)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        hf = config.hf_config
        row = int(hf.kv_lora_rank) + int(hf.qk_rope_head_dim)
        heads = int(hf.num_attention_heads)
        expanded = heads * (
            int(hf.qk_nope_head_dim) + int(hf.qk_rope_head_dim) + int(hf.v_head_dim)
        )
        logger.info(
            "DeepSeek-V2 MLA: the KV cache holds %d values per token and layer (the expanded "
            "per-head K and V would take %d)",
            row,
            expanded,
        )

    def checkpoint_tensors(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterable[tuple[str, torch.Tensor]]:
        # A GGUF's kv_b_proj may come as two halves (models/deepseek_v2_checkpoint.py).
        return super().checkpoint_tensors(with_joined_kv_b(weights))

    @classmethod
    def make_layer(
        cls, config: ModelConfig, layer_id: int, rotary_emb: RotaryEmbedding
    ) -> nn.Module:
        return DeepseekV2DecoderLayer(config, layer_id, rotary_emb, cls.make_mlp(config, layer_id))

    @classmethod
    def make_mlp(cls, config: ModelConfig, layer_id: int) -> nn.Module:
        hf = config.hf_config
        if not is_moe_layer(hf, layer_id):
            return LlamaMLP(config)
        inter = int(hf.moe_intermediate_size)
        shared = int(getattr(hf, "n_shared_experts", 0) or 0) * inter
        return SparseMoeBlock(
            config, int(hf.n_routed_experts), inter, deepseek_router(hf), shared or None
        )
