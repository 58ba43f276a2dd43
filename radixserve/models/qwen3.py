"""Qwen3 (dense): Llama-shaped, with an RMSNorm over each head of q and k before RoPE."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from radixserve.models.llama import AttentionOptions, LlamaForCausalLM, QKNorm

if TYPE_CHECKING:
    from radixserve.models.config import ModelConfig

logger = logging.getLogger(__name__)


class Qwen3ForCausalLM(LlamaForCausalLM):
    @classmethod
    def attention_options(cls, config: ModelConfig) -> AttentionOptions:
        return AttentionOptions(config.attention_bias, config.attention_bias, QKNorm.PER_HEAD)
