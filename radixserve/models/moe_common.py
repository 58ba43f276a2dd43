"""What the mixture-of-experts families share: the sparse MLP block (router, routed experts,
an optional shared expert) and the loading of expert tensors in any checkpoint layout.

A MoE layer is the Llama decoder layer with this block as its MLP (LlamaDecoderLayer's `mlp`),
so attention, norms and the residual stream are the dense families' own; the block never takes
the one-call C++ layer (layers/fused_decoder.py runs dense MLPs only).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from radixserve.layers.linear import ReplicatedLinear
from radixserve.layers.moe import FusedMoE, RouterSpec, expert_shard, per_expert_tensors
from radixserve.models.llama import LlamaMLP

if TYPE_CHECKING:
    from radixserve.models.config import ModelConfig


class SparseMoeBlock(nn.Module):
    """gate (the router, [experts, hidden]), experts (FusedMoE), and where the family has one a
    shared expert every token goes through, scaled by sigmoid(shared_expert_gate(x)) when that
    gate exists (Qwen2-MoE). Parameter names are transformers' (mlp.gate, mlp.experts,
    mlp.shared_expert, mlp.shared_expert_gate)."""

    def __init__(
        self,
        config: ModelConfig,
        num_experts: int,
        expert_intermediate_size: int,
        router: RouterSpec,
        shared_intermediate_size: int | None = None,
        shared_expert_gate: bool = False,
    ) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.gate = ReplicatedLinear(hidden, num_experts)
        self.experts = FusedMoE(
            num_experts, hidden, expert_intermediate_size, router, config.hidden_act
        )
        self.shared_expert: LlamaMLP | None = None
        self.shared_expert_gate: ReplicatedLinear | None = None
        if shared_intermediate_size:
            self.shared_expert = LlamaMLP(config, shared_intermediate_size)
            if shared_expert_gate:
                self.shared_expert_gate = ReplicatedLinear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        out = self.experts(flat, self.gate(flat))
        if self.shared_expert is not None:
            shared = self.shared_expert(flat)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(flat)) * shared
            out = out + shared
        return out.reshape(x.shape)


def is_sparse_layer(hf_config: object, layer_id: int, num_experts: int) -> bool:
    """transformers' rule for Qwen2/3-MoE: experts on every decoder_sparse_step-th layer, except
    the layers listed in mlp_only_layers, which keep a dense MLP."""
    step = int(getattr(hf_config, "decoder_sparse_step", 1) or 1)
    dense = getattr(hf_config, "mlp_only_layers", None) or ()
    return layer_id not in dense and num_experts > 0 and (layer_id + 1) % step == 0


class MoEWeights:
    """Mixed into a LlamaForCausalLM family: its checkpoint's expert tensors, per expert or
    stacked, load into the FusedMoE stacks. `module_renames` ((checkpoint's, ours) pairs) maps a
    checkpoint's module names onto ours (Mixtral's block_sparse_moe -> mlp)."""

    module_renames: tuple[tuple[str, str], ...] = ()

    def checkpoint_tensors(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterable[tuple[str, torch.Tensor]]:
        return per_expert_tensors(self._renamed(weights))

    def _renamed(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            for old, new in self.module_renames:
                name = name.replace(old, new)
            yield name, tensor

    def param_shard(self, name: str) -> tuple[str, object] | None:
        return expert_shard(name)
