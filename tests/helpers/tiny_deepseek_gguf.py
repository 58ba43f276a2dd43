"""A tiny DeepSeek-V2 GGUF written as llama.cpp's converter writes one (convert_hf_to_gguf.py's
DeepseekV2Model): MLA's projections under their own names, experts stacked as
ffn_{gate,up,down}_exps, the shared experts ffn_*_shexp, the MLA sizes, dense lead layers,
routing and YaRN in the metadata. `split_kv_b` writes the newer layout (kv_b_proj as attn_k_b,
transposed per head, and attn_v_b; key/value_length of the cached row and head_count_kv 1, the
q/k and v heads in key/value_length_mla), else the older one (attn_kv_b whole)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from tests.helpers.tiny_gguf import _add_tokenizer, _gguf_tensors

_ATTN = {
    "q_proj": "attn_q",
    "q_a_proj": "attn_q_a",
    "q_a_layernorm": "attn_q_a_norm",
    "q_b_proj": "attn_q_b",
    "kv_a_proj_with_mqa": "attn_kv_a_mqa",
    "kv_a_layernorm": "attn_kv_a_norm",
    "kv_b_proj": "attn_kv_b",
    "o_proj": "attn_output",
}


def _tensors(hf_model: torch.nn.Module, split_kv_b: bool) -> list[tuple[str, np.ndarray]]:
    cfg = hf_model.config
    renamed = {}
    for name, value in hf_model.state_dict().items():
        name = name.replace(".mlp.shared_experts.", ".mlp.shared_expert.")
        renamed[name] = value
    # tiny_gguf's names for everything but MLA's projections, which it does not know.
    attn = {n: v for n, v in renamed.items() if ".self_attn." in n}
    rest = {n: v for n, v in renamed.items() if ".self_attn." not in n}
    out = _gguf_tensors(SimpleNamespace(config=cfg, state_dict=lambda: rest))  # type: ignore[arg-type]
    heads, nope, v = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim
    for name, value in attn.items():
        parts = name.split(".")
        block, module, suffix = parts[2], parts[4], parts[5]
        array = value.float().numpy()
        if module == "kv_b_proj" and split_kv_b:
            per_head = array.reshape(heads, nope + v, -1)
            out.append((f"blk.{block}.attn_k_b.{suffix}", per_head[:, :nope].transpose(0, 2, 1)))
            out.append((f"blk.{block}.attn_v_b.{suffix}", per_head[:, nope:]))
        else:
            out.append((f"blk.{block}.{_ATTN[module]}.{suffix}", array))
    return [(n, np.ascontiguousarray(a, dtype=np.float32)) for n, a in out]


def write_deepseek2_gguf(
    path: Path,
    hf_model: torch.nn.Module,
    split_kv_b: bool,
    quantize: bool = False,
    sigmoid_gating: bool = False,
) -> Path:
    """Write `hf_model` (vocab of at most 59) as a deepseek2 GGUF; with `quantize`, 2-D weights
    whose rows are whole Q8_0 blocks (not the embedding or the router) are stored Q8_0;
    `sigmoid_gating` marks the router sigmoid, as a DeepSeek-V3 file's is."""
    import gguf

    cfg = hf_model.config
    writer = gguf.GGUFWriter(str(path), "deepseek2")
    writer.add_name("tiny-deepseek2")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_leading_dense_block_count(cfg.first_k_dense_replace)
    if cfg.q_lora_rank is not None:
        writer.add_q_lora_rank(cfg.q_lora_rank)
    writer.add_kv_lora_rank(cfg.kv_lora_rank)
    qk_head = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    if split_kv_b:
        writer.add_head_count_kv(1)
        writer.add_key_length(cfg.kv_lora_rank + cfg.qk_rope_head_dim)
        writer.add_value_length(cfg.kv_lora_rank)
        writer.add_key_length_mla(qk_head)
        writer.add_value_length_mla(cfg.v_head_dim)
    else:
        writer.add_head_count_kv(cfg.num_key_value_heads)
        writer.add_key_length(qk_head)
        writer.add_value_length(cfg.v_head_dim)
    writer.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    writer.add_expert_count(cfg.n_routed_experts)
    writer.add_expert_used_count(cfg.num_experts_per_tok)
    writer.add_expert_shared_count(cfg.n_shared_experts)
    writer.add_expert_weights_scale(cfg.routed_scaling_factor)
    writer.add_expert_weights_norm(bool(cfg.norm_topk_prob))
    gating = gguf.ExpertGatingFuncType
    writer.add_expert_gating_func(gating.SIGMOID if sigmoid_gating else gating.SOFTMAX)
    if cfg.topk_method == "group_limited_greedy":
        writer.add_expert_group_count(cfg.n_group)
        writer.add_expert_group_used_count(cfg.topk_group)
    writer.add_rope_dimension_count(cfg.qk_rope_head_dim)
    rope = cfg.rope_parameters
    if rope.get("rope_type") == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        writer.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])
    _add_tokenizer(writer, cfg.vocab_size)
    q8 = gguf.GGMLQuantizationType.Q8_0
    for name, value in _tensors(hf_model, split_kv_b):
        blocks = value.ndim >= 2 and value.shape[-1] % 32 == 0
        skip = name.startswith("token_embd") or ".ffn_gate_inp" in name
        if quantize and blocks and not skip:
            writer.add_tensor(name, gguf.quants.quantize(value, q8), raw_dtype=q8)
        else:
            writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
