"""A tiny gpt-oss GGUF written as llama.cpp's converter writes one (convert_hf_to_gguf.py's
GptOssModel): experts as ffn_{gate,up,down}_exps [experts, rows, cols] with gate and up taken
apart from transformers' alternating columns, their biases ffn_*_exps.bias, the router
ffn_gate_inp with a bias, the sinks attn_sinks, the pre-MLP norm post_attention_norm, YaRN
and the sliding window in the metadata."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tests.helpers.tiny_gguf import _add_model_metadata

_BLOCK = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "post_attention_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.router": "ffn_gate_inp",
}
_TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def gpt_oss_gguf_tensors(hf_model: torch.nn.Module) -> list[tuple[str, np.ndarray]]:
    """(GGUF name, float32 array) of every tensor, experts [experts, out, in]."""
    out = []
    for name, tensor in hf_model.state_dict().items():
        value = tensor.float().numpy()
        module, _, suffix = name.rpartition(".")
        if module in _TOP:
            out.append((f"{_TOP[module]}.{suffix}", value))
            continue
        block = f"blk.{name.split('.')[2]}"
        rest = ".".join(name.split(".")[3:])
        if rest == "self_attn.sinks":
            out.append((f"{block}.attn_sinks.weight", value))
        elif rest == "mlp.experts.gate_up_proj":  # [E, hidden, 2I], gate/up alternating
            out.append((f"{block}.ffn_gate_exps.weight", value[:, :, 0::2].transpose(0, 2, 1)))
            out.append((f"{block}.ffn_up_exps.weight", value[:, :, 1::2].transpose(0, 2, 1)))
        elif rest == "mlp.experts.gate_up_proj_bias":
            out.append((f"{block}.ffn_gate_exps.bias", value[:, 0::2]))
            out.append((f"{block}.ffn_up_exps.bias", value[:, 1::2]))
        elif rest == "mlp.experts.down_proj":  # [E, I, hidden]
            out.append((f"{block}.ffn_down_exps.weight", value.transpose(0, 2, 1)))
        elif rest == "mlp.experts.down_proj_bias":
            out.append((f"{block}.ffn_down_exps.bias", value))
        else:
            out.append((f"{block}.{_BLOCK[module.split('.', 3)[3]]}.{suffix}", value))
    return [(n, np.ascontiguousarray(v, dtype=np.float32)) for n, v in out]


def write_gpt_oss_gguf(path: Path, hf_model: torch.nn.Module, mxfp4: bool) -> Path:
    """Write `hf_model` (vocab of at most 59) as a gpt-oss GGUF, the expert weights MXFP4
    when `mxfp4` (llama.cpp's converter keeps the published MXFP4 blocks), else F32."""
    import gguf

    cfg = hf_model.config
    writer = gguf.GGUFWriter(str(path), "gpt-oss")
    writer.add_name("tiny-gpt-oss")
    _add_model_metadata(writer, cfg, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
    writer.add_expert_count(cfg.num_local_experts)
    writer.add_expert_used_count(cfg.num_experts_per_tok)
    writer.add_expert_feed_forward_length(cfg.intermediate_size)
    writer.add_sliding_window(cfg.sliding_window)
    rope = cfg.rope_parameters
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(rope["factor"])
    writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    mx = gguf.GGMLQuantizationType.MXFP4
    for name, value in gpt_oss_gguf_tensors(hf_model):
        if mxfp4 and name.endswith("_exps.weight"):
            writer.add_tensor(name, gguf.quants.quantize(value, mx), raw_dtype=mx)
        else:
            writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def round_experts_through_mxfp4(hf_model: torch.nn.Module) -> None:
    """Replace the model's expert weights by their MXFP4 round trip (gguf-py's quantizer and
    dequantizer), so it is the model an MXFP4 file of it describes."""
    import gguf

    mx = gguf.GGMLQuantizationType.MXFP4
    with torch.no_grad():
        for layer in hf_model.model.layers:
            for param in (layer.mlp.experts.gate_up_proj, layer.mlp.experts.down_proj):
                # Quantized along the input dimension, as the file's rows are.
                rows = param.detach().transpose(1, 2).contiguous().numpy()
                back = gguf.quants.dequantize(gguf.quants.quantize(rows, mx), mx)
                param.copy_(torch.from_numpy(np.ascontiguousarray(back)).transpose(1, 2))
