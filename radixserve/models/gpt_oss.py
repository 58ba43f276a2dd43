"""gpt-oss (gpt-oss-20b, gpt-oss-120b): pre-norm Llama layers whose q/k/v/o projections have
biases and whose attention adds a learned per-head sink logit to the softmax denominator,
alternating sliding-window and full attention as `layer_types` says, YaRN RoPE; every MLP a
sparse block whose router (with a bias) takes the top num_experts_per_tok logits and softmaxes
over those only, and whose experts (with biases) apply a clamped SwiGLU:
(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit).

Checkpoints: transformers' float form, or the published MXFP4 experts, kept as MXFP4 blocks
(models/gpt_oss_blocks.py: 17 bytes per 32 weights, run by the same block kernels as a GGUF
file's MXFP4 experts) and decoded to the model dtype only where a tensor-parallel rank's slice
would not be whole blocks (models/gpt_oss_checkpoint.py). The layers run module by module (the one-call C++
layer has no sinks, biased experts or clamped SwiGLU); attention runs the C++ kernel with its
sink term on intel_amx (PyTorch where the C++ kernels are not built, or a window or batch the
kernel cannot see exactly) and the PyTorch reference on torch_native.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

from radixserve.layers.activation import ClampedSwiGLU
from radixserve.layers.linear import ReplicatedLinear
from radixserve.layers.moe import FusedMoE, RouterSpec, Scoring, expert_shard
from radixserve.models.gpt_oss_blocks import MxFp4ExpertLoader
from radixserve.models.gpt_oss_checkpoint import gpt_oss_tensors
from radixserve.models.llama import AttentionOptions, LlamaForCausalLM

if TYPE_CHECKING:
    from radixserve.models.config import ModelConfig

logger = logging.getLogger(__name__)

SLIDING = "sliding_attention"


class GptOssMoeBlock(nn.Module):
    """router (a biased linear, [experts, hidden]) and experts (FusedMoE with biases and the
    clamped SwiGLU); the names are transformers' (mlp.router, mlp.experts)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hf = config.hf_config
        num_experts = int(hf.num_local_experts)
        hidden = config.hidden_size
        self.router = ReplicatedLinear(hidden, num_experts, bias=True)
        act = ClampedSwiGLU(
            float(getattr(hf, "swiglu_alpha", 1.702)), float(getattr(hf, "swiglu_limit", 7.0))
        )
        spec = RouterSpec(int(hf.num_experts_per_tok), Scoring.TOPK_SOFTMAX)
        self.experts = FusedMoE(
            num_experts, hidden, config.intermediate_size, spec, bias=True, act=act
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        return self.experts(flat, self.router(flat)).reshape(x.shape)


class GptOssForCausalLM(LlamaForCausalLM):
    def __init__(self, config: ModelConfig) -> None:
        quant = getattr(config.hf_config, "quantization_config", None) or {}
        method = quant.get("quant_method") if isinstance(quant, dict) else None
        if method not in (None, "mxfp4"):
            raise ValueError(f"gpt-oss with quant_method {method!r} is not supported (mxfp4 is)")
        super().__init__(config)
        self._mxfp4_experts = MxFp4ExpertLoader(self) if method == "mxfp4" else None

    @classmethod
    def attention_options(cls, config: ModelConfig) -> AttentionOptions:
        bias = config.attention_bias
        return AttentionOptions(bias, bias, sinks=True)

    @classmethod
    def layer_attention_options(cls, config: ModelConfig, layer_id: int) -> AttentionOptions:
        """The window on the layers layer_types marks sliding (transformers' GptOssConfig fills
        layer_types, alternating from a sliding layer 0); gpt-oss has no use_sliding_window
        switch, so the Qwen rule of typed_layer_window does not apply."""
        options = cls.attention_options(config)
        hf = config.hf_config
        types = getattr(hf, "layer_types", None) or [
            SLIDING if i % 2 == 0 else "full_attention" for i in range(config.num_hidden_layers)
        ]
        window = getattr(hf, "sliding_window", None)
        if types[layer_id] != SLIDING or window is None or int(window) >= config.context_len:
            return options  # a window as long as the context masks nothing
        return options._replace(sliding_window=int(window))

    @classmethod
    def make_mlp(cls, config: ModelConfig, layer_id: int) -> nn.Module | None:
        return GptOssMoeBlock(config)

    def checkpoint_tensors(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterable[tuple[str, torch.Tensor]]:
        return gpt_oss_tensors(weights, self._mxfp4_experts)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(weights)
        if self._mxfp4_experts is not None:
            logger.info(
                "gpt-oss: %d MoE layers keep their MXFP4 experts as blocks (17 bytes per 32 "
                "weights)",
                self._mxfp4_experts.layers_on_blocks,
            )

    def param_shard(self, name: str) -> tuple[str, object] | None:
        return expert_shard(name)
