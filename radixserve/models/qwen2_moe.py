"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention (q/k/v biases) with
Qwen3-MoE's sparse layers plus a shared expert every token goes through (of
shared_expert_intermediate_size), scaled by sigmoid(shared_expert_gate(x)) and added to the
routed experts' sum. Qwen2's use_sliding_window is not applied (as for Qwen2)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixserve.models.llama import LlamaDecoderLayer
from radixserve.models.moe_common import MoEWeights
from radixserve.models.qwen2 import Qwen2ForCausalLM
from radixserve.models.qwen3_moe import qwen_moe_block

if TYPE_CHECKING:
    from torch import nn

    from radixserve.layers.rotary_embedding import RotaryEmbedding
    from radixserve.models.config import ModelConfig


class Qwen2MoeForCausalLM(MoEWeights, Qwen2ForCausalLM):
    @classmethod
    def make_layer(
        cls, config: ModelConfig, layer_id: int, rotary_emb: RotaryEmbedding
    ) -> nn.Module:
        return LlamaDecoderLayer(
            config,
            layer_id,
            rotary_emb,
            cls.layer_attention_options(config, layer_id),
            mlp=qwen_moe_block(config, layer_id, shared=True),
        )
