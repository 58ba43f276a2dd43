"""Gemma 3 (text: Gemma3ForCausalLM, model_type gemma3_text): Gemma 2's layers plus a Gemma
RMSNorm over each head of q and k before RoPE, and a RoPE table of its own for the sliding-window
layers (the "sliding_attention" rope parameters, rope_local_base_freq in older configs), while
the global layers keep the model's (which may be scaled). Five sliding layers per global one
by default. Attention scores are not soft-capped: transformers' Gemma 3 ignores
attn_logit_softcapping, and so does this."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from radixserve.layers.rotary_embedding import RotaryEmbedding, get_rope
from radixserve.models.config import layer_type_rope
from radixserve.models.gemma2 import SLIDING, Gemma2ForCausalLM, GemmaModel, layer_types
from radixserve.models.llama import AttentionOptions, QKNorm

if TYPE_CHECKING:
    from radixserve.models.config import ModelConfig

logger = logging.getLogger(__name__)

DEFAULT_LOCAL_ROPE_THETA = 10000.0


def local_rope(config: ModelConfig) -> RotaryEmbedding:
    """The sliding-window layers' RoPE table."""
    params = layer_type_rope(config.hf_config, SLIDING)
    if params is None:
        base = getattr(config.hf_config, "rope_local_base_freq", None)
        params = (float(base or DEFAULT_LOCAL_ROPE_THETA), None)
    theta, scaling = params
    return get_rope(
        config.head_dim,
        config.rotary_dim,
        max_position=config.context_len,
        base=theta,
        rope_scaling=scaling,
        original_max_position=config.max_position_embeddings,
    )


class Gemma3Model(GemmaModel):
    def layer_rope(self, config: ModelConfig, layer_id: int) -> RotaryEmbedding:
        if layer_types(config, Gemma3ForCausalLM.sliding_period)[layer_id] != SLIDING:
            return self.rotary_emb
        if "local_rotary_emb" not in self._modules:  # built for the first sliding layer
            table = local_rope(config)
            # LlamaModel looks table rows up once, with the global table, for every layer.
            if type(table) is not RotaryEmbedding or type(self.rotary_emb) is not RotaryEmbedding:
                raise ValueError("Gemma 3 with LongRoPE tables is not supported")
            self.local_rotary_emb = table
        return self.local_rotary_emb


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    model_class = Gemma3Model
    # Without layer_types or sliding_window_pattern: five sliding layers, then a global one.
    sliding_period = 6

    def __init__(self, config: ModelConfig) -> None:
        if getattr(config.hf_config, "attn_logit_softcapping", None) is not None:
            logger.warning(
                "attn_logit_softcapping is set in a Gemma 3 config; as in transformers, "
                "Gemma 3 does not soft-cap attention scores"
            )
        super().__init__(config)

    @classmethod
    def attention_options(cls, config: ModelConfig) -> AttentionOptions:
        options = super().attention_options(config)
        return options._replace(qk_norm=QKNorm.GEMMA_PER_HEAD, logit_cap=None)
