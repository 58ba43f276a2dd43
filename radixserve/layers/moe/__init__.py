"""Mixture-of-experts layers: routing (router.py), the experts' weight forms (methods.py),
checkpoint names (checkpoint.py) and the layer that runs them (fused_moe.py)."""

from radixserve.layers.moe.checkpoint import expert_shard, per_expert_tensors
from radixserve.layers.moe.fused_call import MoECallArgs, moe_call_args
from radixserve.layers.moe.fused_moe import FusedMoE
from radixserve.layers.moe.methods import (
    ExpertBlocks,
    ExpertsMethod,
    GGUFExpertsMethod,
    UnquantizedExpertsMethod,
    use_gguf_experts,
)
from radixserve.layers.moe.router import RouterSpec, Routing, Scoring, route

__all__ = [
    "ExpertBlocks",
    "ExpertsMethod",
    "FusedMoE",
    "GGUFExpertsMethod",
    "MoECallArgs",
    "RouterSpec",
    "Routing",
    "Scoring",
    "UnquantizedExpertsMethod",
    "expert_shard",
    "moe_call_args",
    "per_expert_tensors",
    "route",
    "use_gguf_experts",
]
