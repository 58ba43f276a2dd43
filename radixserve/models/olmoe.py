"""OLMoE (OLMoE-1B-7B): pre-norm Llama layers whose q and k are normed over their full
projection width (as OLMo 2's, but before attention rather than after each block), and every
MLP a sparse block of num_experts experts of intermediate_size, the top num_experts_per_tok of a
softmax router per token (renormalized when norm_topk_prob)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixserve.layers.moe import RouterSpec
from radixserve.models.llama import (
    AttentionOptions,
    LlamaForCausalLM,
    QKNorm,
)
from radixserve.models.moe_common import MoEWeights, SparseMoeBlock

if TYPE_CHECKING:
    from torch import nn

    from radixserve.models.config import ModelConfig


class OlmoeForCausalLM(MoEWeights, LlamaForCausalLM):
    def __init__(self, config: ModelConfig) -> None:
        if getattr(config.hf_config, "clip_qkv", None) is not None:
            # No released OLMoE sets it; clamping q/k/v would need its own attention path.
            raise ValueError("OLMoE with clip_qkv is not supported")
        super().__init__(config)

    @classmethod
    def attention_options(cls, config: ModelConfig) -> AttentionOptions:
        return AttentionOptions(config.attention_bias, config.attention_bias, QKNorm.FULL_WIDTH)

    @classmethod
    def make_mlp(cls, config: ModelConfig, layer_id: int) -> nn.Module | None:
        hf = config.hf_config
        router = RouterSpec(int(hf.num_experts_per_tok), renormalize=bool(hf.norm_topk_prob))
        return SparseMoeBlock(config, int(hf.num_experts), config.intermediate_size, router)
