"""A DeepSeek-V2 config from a `deepseek2` GGUF's metadata (transformers' GGUF readers have no
DeepSeek-V2), as llama.cpp reads the file (llama-model.cpp, convert_hf_to_gguf.py):

- the q/k head: key_length_mla (newer files, whose key_length / value_length describe MLA's
  cached row, kv_lora_rank + rope dims, and head_count_kv is 1) else key_length, minus the
  rope.dimension_count rotated dims; the value head value_length_mla else value_length;
- the first leading_dense_block_count layers dense, every later one sparse;
- the routed weights scaled by expert_weights_scale, renormalized when expert_weights_norm;
  grouped top-k only where the file stores expert_group_count (llama.cpp runs V2 files without
  it as plain greedy top-k, and so do we);
- YaRN: rope.scaling.yarn_log_multiplier is 0.1 * mscale_all_dim (the softmax scale's
  mscale), the RoPE table is not scaled (attention_factor 1, as llama.cpp runs it: true of
  every published V2 config, whose mscale equals mscale_all_dim), betas 32 and 1.

A sigmoid router (expert_gating_func 2, DeepSeek-V3's) is refused: V3 is not supported.
"""

from __future__ import annotations

from typing import Any

from radixserve.models.gguf_config import _value, arch_key, special_token_ids

_ARCH = "deepseek2"
_SIGMOID_GATING = 2  # gguf.ExpertGatingFuncType.SIGMOID
# convert_hf_to_gguf.py writes 0.1 * mscale_all_dim as the YaRN log multiplier.
_YARN_LOG_MUL_PER_MSCALE = 0.1


def deepseek2_config(reader: object) -> Any:
    from transformers import DeepseekV2Config

    key = arch_key(reader, _ARCH)

    gating = _value(reader, f"{_ARCH}.expert_gating_func")
    if gating is not None and int(gating) == _SIGMOID_GATING:
        raise ValueError("a sigmoid-gated deepseek2 GGUF (DeepSeek-V3) is not supported")
    heads = int(key("attention.head_count"))
    rope_dim = int(key("rope.dimension_count"))
    qk_head = int(key("attention.key_length_mla", 0) or key("attention.key_length"))
    v_head = int(key("attention.value_length_mla", 0) or key("attention.value_length"))
    q_lora_rank = _value(reader, f"{_ARCH}.attention.q_lora_rank")
    groups = int(key("expert_group_count", 0) or 0)
    grouped = groups > 1
    tokens = reader.fields.get("tokenizer.ggml.tokens")  # type: ignore[attr-defined]
    names = {t.name for t in reader.tensors}  # type: ignore[attr-defined]
    ids = special_token_ids(reader)
    return DeepseekV2Config(
        vocab_size=len(tokens.data) if tokens is not None else int(key("vocab_size")),
        hidden_size=int(key("embedding_length")),
        intermediate_size=int(key("feed_forward_length")),
        moe_intermediate_size=int(key("expert_feed_forward_length")),
        num_hidden_layers=int(key("block_count")),
        num_attention_heads=heads,
        # transformers' V2 configs repeat the query heads here; MLA caches one latent head.
        num_key_value_heads=heads,
        max_position_embeddings=int(key("context_length")),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        rope_parameters=_rope(reader, float(key("rope.freq_base"))),
        kv_lora_rank=int(key("attention.kv_lora_rank")),
        q_lora_rank=None if q_lora_rank is None else int(q_lora_rank),
        qk_rope_head_dim=rope_dim,
        qk_nope_head_dim=qk_head - rope_dim,
        v_head_dim=v_head,
        n_routed_experts=int(key("expert_count")),
        num_experts_per_tok=int(key("expert_used_count")),
        n_shared_experts=int(key("expert_shared_count", 0)),
        first_k_dense_replace=int(key("leading_dense_block_count", 0)),
        moe_layer_freq=1,
        routed_scaling_factor=float(key("expert_weights_scale", 1.0)),
        norm_topk_prob=bool(key("expert_weights_norm", False)),
        topk_method="group_limited_greedy" if grouped else "greedy",
        n_group=groups if grouped else None,
        topk_group=int(key("expert_group_used_count")) if grouped else None,
        tie_word_embeddings="output.weight" not in names,
        **{name: None if value is None else int(value) for name, value in ids.items()},
    )


def _rope(reader: object, theta: float) -> dict[str, Any]:
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    if _value(reader, f"{_ARCH}.rope.scaling.type") != "yarn":
        return rope
    log_mul = float(_value(reader, f"{_ARCH}.rope.scaling.yarn_log_multiplier") or 0.0)
    mscale_all_dim = log_mul / _YARN_LOG_MUL_PER_MSCALE
    original = _value(reader, f"{_ARCH}.rope.scaling.original_context_length")
    if original is None:
        raise ValueError(f"a YaRN {_ARCH} GGUF needs rope.scaling.original_context_length")
    rope.update(
        rope_type="yarn",
        factor=float(_value(reader, f"{_ARCH}.rope.scaling.factor")),
        original_max_position_embeddings=int(original),
        beta_fast=32.0,
        beta_slow=1.0,
        mscale=mscale_all_dim,
        mscale_all_dim=mscale_all_dim,
        # llama.cpp's RoPE table is never scaled for deepseek2 (it divides YaRN's factor back
        # out); equal mscales say so, but a zero multiplier would fall back to YaRN's default.
        attention_factor=1.0,
    )
    return rope
