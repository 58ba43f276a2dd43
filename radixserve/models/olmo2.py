"""OLMo 2: no norms before attention and MLP; instead each block's output is normed
(post_attention_layernorm, post_feedforward_layernorm) before it joins the residual stream, and
q and k are normed over their full projection width (all heads at once) before RoPE."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from torch import nn

from radixserve.layers.layernorm import RMSNorm
from radixserve.models.llama import (
    AttentionOptions,
    LlamaAttention,
    LlamaForCausalLM,
    LlamaMLP,
    QKNorm,
)

if TYPE_CHECKING:
    from radixserve.layers.rotary_embedding import RotaryEmbedding
    from radixserve.model_executor.forward_batch import ForwardBatch
    from radixserve.models.config import ModelConfig

logger = logging.getLogger(__name__)


class Olmo2DecoderLayer(nn.Module):
    """Takes and returns (hidden, residual) like the Llama layer, so LlamaModel runs it: its
    output is hidden + residual, the MLP block's normed output plus the stream after attention.
    It offers no fused one-call form (the C++ layer is pre-norm), so it runs module by module."""

    def __init__(
        self,
        config: ModelConfig,
        layer_id: int,
        rotary_emb: RotaryEmbedding,
        options: AttentionOptions,
    ) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_id, rotary_emb, options)
        self.mlp = LlamaMLP(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        forward_batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            hidden = hidden + residual  # the previous layer's output
        attn = self.post_attention_layernorm(self.self_attn(positions, hidden, forward_batch))
        hidden = hidden + attn
        return self.post_feedforward_layernorm(self.mlp(hidden)), hidden


class Olmo2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def attention_options(cls, config: ModelConfig) -> AttentionOptions:
        return AttentionOptions(config.attention_bias, config.attention_bias, QKNorm.FULL_WIDTH)

    @classmethod
    def make_layer(
        cls, config: ModelConfig, layer_id: int, rotary_emb: RotaryEmbedding
    ) -> nn.Module:
        return Olmo2DecoderLayer(config, layer_id, rotary_emb, cls.attention_options(config))
