"""Granite (3.x dense): Llama-shaped, with four scalars from the config: the embeddings are
multiplied by embedding_multiplier, each attention and MLP output by residual_multiplier before
it joins the residual stream, attention scores by attention_multiplier (instead of
head_dim ** -0.5), and the logits are divided by logits_scaling."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from radixserve.models.llama import AttentionOptions, LlamaForCausalLM

if TYPE_CHECKING:
    from radixserve.models.config import ModelConfig

logger = logging.getLogger(__name__)


def _multiplier(config: ModelConfig, name: str) -> float:
    value = getattr(config.hf_config, name, None)
    return 1.0 if value is None else float(value)


class GraniteForCausalLM(LlamaForCausalLM):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.logits_scaling = _multiplier(config, "logits_scaling")

    @classmethod
    def attention_options(cls, config: ModelConfig) -> AttentionOptions:
        scaling = _multiplier(config, "attention_multiplier")
        return AttentionOptions(config.attention_bias, config.attention_bias, scaling=scaling)

    @classmethod
    def residual_multiplier(cls, config: ModelConfig) -> float:
        return _multiplier(config, "residual_multiplier")

    @classmethod
    def embedding_multiplier(cls, config: ModelConfig) -> float:
        return _multiplier(config, "embedding_multiplier")

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        return logits if self.logits_scaling == 1.0 else logits / self.logits_scaling
