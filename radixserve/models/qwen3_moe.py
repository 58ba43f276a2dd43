"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (per-head q/k norms) with a
sparse MLP of `num_experts` experts of moe_intermediate_size, the top num_experts_per_tok of a
softmax router per token (renormalized when norm_topk_prob), on every decoder_sparse_step-th
layer except those in mlp_only_layers, which keep a dense MLP of intermediate_size."""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixserve.layers.moe import RouterSpec
from radixserve.models.moe_common import MoEWeights, SparseMoeBlock, is_sparse_layer
from radixserve.models.qwen3 import Qwen3ForCausalLM

if TYPE_CHECKING:
    from torch import nn

    from radixserve.models.config import ModelConfig


def qwen_moe_block(config: ModelConfig, layer_id: int, shared: bool) -> SparseMoeBlock | None:
    """Layer `layer_id`'s sparse block of a Qwen2/3-MoE config, None for a dense layer.
    `shared`: Qwen2-MoE's gated shared expert."""
    hf = config.hf_config
    num_experts = int(hf.num_experts)
    if not is_sparse_layer(hf, layer_id, num_experts):
        return None
    router = RouterSpec(int(hf.num_experts_per_tok), renormalize=bool(hf.norm_topk_prob))
    shared_size = int(hf.shared_expert_intermediate_size) if shared else None
    return SparseMoeBlock(
        config,
        num_experts,
        int(hf.moe_intermediate_size),
        router,
        shared_intermediate_size=shared_size,
        shared_expert_gate=shared,
    )


class QwenMoeLayers:
    """The Qwen2/3-MoE families' MLPs (qwen_moe_block); mixed in before the dense model
    class, whose layers they otherwise keep."""

    shared_expert = False  # Qwen2-MoE's gated shared expert

    @classmethod
    def make_mlp(cls, config: ModelConfig, layer_id: int) -> nn.Module | None:
        return qwen_moe_block(config, layer_id, shared=cls.shared_expert)


class Qwen3MoeForCausalLM(QwenMoeLayers, MoEWeights, Qwen3ForCausalLM):
    pass
