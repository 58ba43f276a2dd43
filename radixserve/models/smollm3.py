"""SmolLM3: Llama-shaped, except that some layers apply no RoPE (NoPE layers, `no_rope_layers`:
1 = RoPE, 0 = none; by default every fourth layer has none)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from radixserve.models.llama import AttentionOptions, LlamaForCausalLM

if TYPE_CHECKING:
    from radixserve.models.config import ModelConfig

logger = logging.getLogger(__name__)

DEFAULT_NO_ROPE_INTERVAL = 4


def uses_rope(config: ModelConfig, layer_id: int) -> bool:
    """Whether layer `layer_id` rotates q and k (the config's no_rope_layers, else SmolLM3's
    default of a NoPE layer every no_rope_layer_interval layers)."""
    hf = config.hf_config
    flags = getattr(hf, "no_rope_layers", None)
    if flags is None:
        interval = int(getattr(hf, "no_rope_layer_interval", None) or DEFAULT_NO_ROPE_INTERVAL)
        return (layer_id + 1) % interval != 0
    if len(flags) < config.num_hidden_layers:
        raise ValueError(
            f"no_rope_layers has {len(flags)} entries for {config.num_hidden_layers} layers"
        )
    return bool(flags[layer_id])


class SmolLM3ForCausalLM(LlamaForCausalLM):
    @classmethod
    def layer_attention_options(cls, config: ModelConfig, layer_id: int) -> AttentionOptions:
        options = super().layer_attention_options(config, layer_id)
        return options._replace(rope=uses_rope(config, layer_id))
