"""The shape of a model's KV cache rows: heads per token, their width, and whether V is
stored apart from K.

Most models cache their K and V heads as attention sees them. Multi-head latent attention
(DeepSeek-V2, config key `kv_lora_rank`) caches the compressed form instead: per token one
"head" of kv_lora_rank latent dims plus the qk_rope_head_dim dims of the rotated key shared by
all heads, and its values are the latent itself, read from the same row (so V shares K's
buffer). See models/deepseek_v2_attention.py for how attention works on that form.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from radixserve.models.config import ModelConfig


class KVLayout(NamedTuple):
    num_kv_heads: int
    head_dim: int
    v_shares_k: bool = False


def is_mla(config: ModelConfig) -> bool:
    return bool(getattr(config.hf_config, "kv_lora_rank", None))


def kv_layout(config: ModelConfig, num_kv_heads: int) -> KVLayout:
    """The cache rows of `config`'s model; `num_kv_heads` is what a standard model caches on
    this rank (the latent head of an MLA model is one on every rank)."""
    if is_mla(config):
        hf = config.hf_config
        return KVLayout(1, int(hf.kv_lora_rank) + int(hf.qk_rope_head_dim), v_shares_k=True)
    return KVLayout(num_kv_heads, config.head_dim)
