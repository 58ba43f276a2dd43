"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention (q/k/v biases, the
layer_types windows) with Qwen3-MoE's sparse layers plus a shared expert every token goes
through (of shared_expert_intermediate_size), scaled by sigmoid(shared_expert_gate(x)) and added
to the routed experts' sum."""

from __future__ import annotations

from radixserve.models.moe_common import MoEWeights
from radixserve.models.qwen2 import Qwen2ForCausalLM
from radixserve.models.qwen3_moe import QwenMoeLayers


class Qwen2MoeForCausalLM(QwenMoeLayers, MoEWeights, Qwen2ForCausalLM):
    shared_expert = True
