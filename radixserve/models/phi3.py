"""Phi-3 / Phi-3.5 / Phi-4-mini: Llama-shaped layers.

What differs lives elsewhere: the checkpoint stores q|k|v and gate|up already fused (split
here, so the fused layers load and shard them like any other Llama checkpoint), LongRoPE
(layers/longrope.py), Phi-4-mini's partial rotary (ModelConfig.rotary_dim), and Phi-3-mini's
sliding window (2047 keys a token sees; transformers applies it whenever the config sets one).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch

from radixserve.models.llama import AttentionOptions, LlamaForCausalLM, reference_window_options

if TYPE_CHECKING:
    from radixserve.models.config import ModelConfig

logger = logging.getLogger(__name__)


def split_fused_projections(
    weights: Iterable[tuple[str, torch.Tensor]], config: ModelConfig
) -> Iterator[tuple[str, torch.Tensor]]:
    """Phi-3's qkv_proj and gate_up_proj tensors as the q/k/v and gate/up tensors of a Llama
    checkpoint (row slices: views, no copies)."""
    q_size = config.num_attention_heads * config.head_dim
    kv_size = config.num_key_value_heads * config.head_dim
    inter = config.intermediate_size
    for name, tensor in weights:
        if ".qkv_proj." in name:
            parts = tensor.split([q_size, kv_size, kv_size], dim=0)
            for part_name, part in zip(("q_proj", "k_proj", "v_proj"), parts, strict=True):
                yield name.replace(".qkv_proj.", f".{part_name}."), part
        elif ".gate_up_proj." in name:
            gate, up = tensor.split([inter, inter], dim=0)
            yield name.replace(".gate_up_proj.", ".gate_proj."), gate
            yield name.replace(".gate_up_proj.", ".up_proj."), up
        else:
            yield name, tensor


class Phi3ForCausalLM(LlamaForCausalLM):
    @classmethod
    def attention_options(cls, config: ModelConfig) -> AttentionOptions:
        return reference_window_options(super().attention_options(config), config)

    def checkpoint_tensors(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterable[tuple[str, torch.Tensor]]:
        return split_fused_projections(weights, self.config)
