"""Qwen2 / Qwen2.5: Llama-shaped, with biases on the q, k and v projections (not on o)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from radixserve.models.llama import AttentionOptions, LlamaForCausalLM

if TYPE_CHECKING:
    from radixserve.models.config import ModelConfig

logger = logging.getLogger(__name__)


class Qwen2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def attention_options(cls, config: ModelConfig) -> AttentionOptions:
        return AttentionOptions(qkv_bias=True, o_bias=False)
