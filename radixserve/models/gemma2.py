"""Gemma 2: the Llama stack with, per layer, four norms of Gemma's (1 + weight) kind (input,
post-attention, pre-feedforward, post-feedforward), a GELU(tanh) gated MLP, the softmax scale
query_pre_attn_scalar ** -0.5, attention scores soft-capped (attn_logit_softcapping), and a
sliding window on the layers `layer_types` marks "sliding_attention" (every other one); the
embeddings are multiplied by sqrt(hidden_size) rounded to the model dtype, the logits
soft-capped (final_logit_softcapping). Gemma 3 (models/gemma3.py) builds on these classes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from radixserve.layers.layernorm import GemmaRMSNorm
from radixserve.models.llama import (
    AttentionOptions,
    LlamaAttention,
    LlamaForCausalLM,
    LlamaMLP,
    LlamaModel,
    input_norm,
)

if TYPE_CHECKING:
    from radixserve.layers.rotary_embedding import RotaryEmbedding
    from radixserve.model_executor.forward_batch import ForwardBatch
    from radixserve.models.config import ModelConfig

logger = logging.getLogger(__name__)

SLIDING = "sliding_attention"
FULL = "full_attention"


def optional_float(config: ModelConfig, name: str) -> float | None:
    value = getattr(config.hf_config, name, None)
    return None if value is None else float(value)


def layer_types(config: ModelConfig, default_period: int) -> list[str]:
    """Each layer's type, SLIDING or FULL: the config's layer_types (transformers >= 5 always
    fills it), else every `default_period`-th layer full and the others sliding, as older
    configs mean (Gemma 3's sliding_window_pattern sets the period)."""
    hf = config.hf_config
    types = getattr(hf, "layer_types", None)
    count = config.num_hidden_layers
    if types is None:
        period = int(getattr(hf, "sliding_window_pattern", None) or default_period)
        return [FULL if (i + 1) % period == 0 else SLIDING for i in range(count)]
    if len(types) < count or any(t not in (SLIDING, FULL) for t in types):
        raise ValueError(
            f"layer_types must name {SLIDING!r} or {FULL!r} for each of {count} layers, got "
            f"{list(types)}"
        )
    return list(types[:count])


def check_causal(config: ModelConfig) -> None:
    """Refuse Gemma configs whose attention is not causal (EmbeddingGemma's)."""
    if getattr(config.hf_config, "use_bidirectional_attention", None):
        raise ValueError(
            "use_bidirectional_attention is set: bidirectional Gemma (an embedding model) is not "
            "supported, only causal language models"
        )


class GemmaDecoderLayer(nn.Module):
    """Takes and returns (hidden, residual) like the Llama layer, so LlamaModel runs it: the
    stream is hidden + residual, each block's output is normed before it joins the stream, and
    the next block's pre-norm fuses that add. It offers no fused one-call form (the C++ layer
    has two norms and SiLU), so it runs module by module."""

    def __init__(
        self,
        config: ModelConfig,
        layer_id: int,
        rotary_emb: RotaryEmbedding,
        options: AttentionOptions,
    ) -> None:
        super().__init__()
        size, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = LlamaAttention(config, layer_id, rotary_emb, options)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = GemmaRMSNorm(size, eps)
        self.post_attention_layernorm = GemmaRMSNorm(size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(size, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(size, eps)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        forward_batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, residual = input_norm(self.input_layernorm, hidden, residual)
        attn = self.post_attention_layernorm(self.self_attn(positions, hidden, forward_batch))
        hidden, residual = self.pre_feedforward_layernorm(attn, residual)
        # The next layer's input norm (or the final norm) adds this to the residual.
        return self.post_feedforward_layernorm(self.mlp(hidden)), residual


class GemmaModel(LlamaModel):
    """LlamaModel with Gemma's final norm and embedding scale."""

    def make_norm(self, config: ModelConfig) -> nn.Module:
        return GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        # As transformers: the scale rounded to the model dtype first (bfloat16 turns
        # sqrt(3072) = 55.43 into 55.5), then multiplied in that dtype.
        return hidden * torch.tensor(self.embedding_multiplier, dtype=hidden.dtype)


class Gemma2ForCausalLM(LlamaForCausalLM):
    model_class = GemmaModel
    # Without layer_types, every sliding_period-th layer is global (Gemma 2 alternates).
    sliding_period = 2

    def __init__(self, config: ModelConfig) -> None:
        check_causal(config)
        super().__init__(config)
        self.final_logit_cap = optional_float(config, "final_logit_softcapping")

    @classmethod
    def attention_options(cls, config: ModelConfig) -> AttentionOptions:
        scalar = getattr(config.hf_config, "query_pre_attn_scalar", None) or config.head_dim
        return AttentionOptions(
            config.attention_bias,
            config.attention_bias,
            scaling=float(scalar) ** -0.5,
            logit_cap=optional_float(config, "attn_logit_softcapping"),
        )

    @classmethod
    def layer_window(cls, config: ModelConfig, layer_id: int) -> int | None:
        """Layer `layer_id`'s sliding window (None on global layers, or without a window)."""
        if layer_types(config, cls.sliding_period)[layer_id] != SLIDING:
            return None
        window: Any = getattr(config.hf_config, "sliding_window", None)
        return None if window is None else int(window)

    @classmethod
    def make_layer(
        cls, config: ModelConfig, layer_id: int, rotary_emb: RotaryEmbedding
    ) -> nn.Module:
        options = cls.attention_options(config)._replace(
            sliding_window=cls.layer_window(config, layer_id)
        )
        return GemmaDecoderLayer(config, layer_id, rotary_emb, options)

    @classmethod
    def embedding_multiplier(cls, config: ModelConfig) -> float:
        return config.hidden_size**0.5

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        cap = self.final_logit_cap
        # In float32 (the logits' dtype), in transformers' order.
        return logits if cap is None else torch.tanh(logits / cap) * cap
