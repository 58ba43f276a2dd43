"""Mixtral (8x7B, 8x22B): Mistral's attention with every MLP a sparse block of
num_local_experts experts of intermediate_size, the top num_experts_per_tok of a softmax router
per token, always renormalized. Checkpoints name the block `block_sparse_moe` and the experts'
projections w1 (gate), w3 (up), w2 (down)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixserve.layers.moe import RouterSpec
from radixserve.models.llama import MistralForCausalLM
from radixserve.models.moe_common import MoEWeights, SparseMoeBlock

if TYPE_CHECKING:
    from torch import nn

    from radixserve.models.config import ModelConfig


class MixtralForCausalLM(MoEWeights, MistralForCausalLM):
    module_renames = ((".block_sparse_moe.", ".mlp."),)

    @classmethod
    def make_mlp(cls, config: ModelConfig, layer_id: int) -> nn.Module | None:
        hf = config.hf_config
        router = RouterSpec(int(hf.num_experts_per_tok), renormalize=True)
        return SparseMoeBlock(config, int(hf.num_local_experts), config.intermediate_size, router)
