"""Write tiny Gemma 2/3 GGUF files the way llama.cpp's converter (convert_hf_to_gguf.py,
Gemma2Model / Gemma3Model) writes them: its metadata keys, its tensor names (the
pre-feedforward norm is `ffn_norm`), every norm weight stored plus one, q/k rows unpermuted, no
output tensor (tied), a sentencepiece vocabulary with a chat template."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests.helpers.tiny_gguf import random_blocks

_TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm"}
_BLOCK = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
_PIECES = ["\u2581", *"abcdefghijklmnopqrstuvwxyz", "\u2581a", "\u2581b", "ab", "abc", "\u2581ab"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
    "{{ m['content'] }}<end_of_turn>\n{% endfor %}<start_of_turn>model\n"
)


def gemma_gguf_name(hf_name: str) -> str:
    module, _, suffix = hf_name.rpartition(".")
    if module in _TOP:
        return f"{_TOP[module]}.{suffix}"
    parts = module.split(".")
    return f"blk.{parts[2]}.{_BLOCK['.'.join(parts[3:])]}.{suffix}"


def write_gemma_gguf(
    path: Path,
    hf_model: torch.nn.Module,
    arch: str,
    types: dict[str, int] | None = None,
    default_type: int | None = None,
    eot_token_id: int | None = None,
) -> Path:
    """Write tied Gemma `hf_model` (a vocabulary of at least 38 tokens) as a GGUF of `arch`
    ("gemma2" or "gemma3"). 2-D weights are F32 when `default_type` is None; else random blocks
    of the GGML type named per tensor role in `types` (others `default_type`), and `hf_model`'s
    weights are set to those blocks' dequantization, so the file and the model hold the same
    weights (transformers then serves as the float reference). `eot_token_id` is written as
    tokenizer.ggml.eot_token_id (llama.cpp's converter writes one for some vocabularies)."""
    import gguf

    from radixserve.kernels import gguf_dequant

    cfg = hf_model.config
    if not cfg.tie_word_embeddings:
        raise ValueError("llama.cpp writes Gemma's tied embeddings only")
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{arch}")
    _add_metadata(writer, cfg, arch)
    if eot_token_id is not None:
        writer.add_eot_token_id(eot_token_id)
    for seed, (name, tensor) in enumerate(hf_model.state_dict().items()):
        if name == "lm_head.weight":
            continue
        target = gemma_gguf_name(name)
        if tensor.dim() != 2 or default_type is None:
            value = tensor.float().numpy()
            if name.endswith("norm.weight"):
                value = value + 1  # llama.cpp stores Gemma's norms as 1 + weight
            writer.add_tensor(target, np.ascontiguousarray(value, dtype=np.float32))
            continue
        qtype = (types or {}).get(target.split(".")[-2], default_type)
        rows, k = tensor.shape
        blocks = random_blocks(qtype, rows, k, seed=seed)
        with torch.no_grad():
            tensor.copy_(gguf_dequant.dequantize_rows(blocks, qtype, rows))
        writer.add_tensor(target, blocks.numpy(), raw_dtype=gguf.GGMLQuantizationType(qtype))
    hf_model.tie_weights()
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_metadata(writer: Any, cfg: Any, arch: str) -> None:
    """What llama.cpp's Gemma2Model/Gemma3Model.set_gguf_parameters write."""
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    if cfg.final_logit_softcapping is not None:
        writer.add_final_logit_softcapping(cfg.final_logit_softcapping)
    if cfg.sliding_window is not None:
        writer.add_sliding_window(cfg.sliding_window)
    # llama.cpp derives which layers slide (every other one for Gemma 2, five of six for Gemma
    # 3); a model that differs says so with gguf-py's per-layer pattern key.
    period = 2 if arch == "gemma2" else 6
    slides = [t == "sliding_attention" for t in cfg.layer_types]
    if slides != [i % period < period - 1 for i in range(cfg.num_hidden_layers)]:
        writer.add_sliding_window_pattern(slides)
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
    else:
        _add_gemma3_rope(writer, cfg.rope_parameters)
    _add_tokenizer(writer, cfg.vocab_size)


def _add_gemma3_rope(writer: Any, rope: dict[str, Any]) -> None:
    """The global layers' base and linear scaling, as llama.cpp writes them; a sliding-layer
    base other than llama.cpp's fixed 10000 as gguf-py's freq_base_swa key."""
    import gguf

    full, local = rope["full_attention"], rope["sliding_attention"]
    writer.add_rope_freq_base(full["rope_theta"])
    if full.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(full["factor"])
    if local["rope_theta"] != 10000.0:
        writer.add_rope_freq_base_swa(local["rope_theta"])


def _add_tokenizer(writer: Any, vocab_size: int) -> None:
    """A sentencepiece ("llama") vocabulary, as Gemma's GGUFs carry."""
    pieces = _SPECIALS + _PIECES
    pieces += [f"<unused{i}>" for i in range(vocab_size - len(pieces))]
    if len(pieces) != vocab_size:
        raise ValueError(f"tiny Gemma vocabularies hold at least {len(pieces)} tokens")
    control = {0, 1, 2, 4, 5}
    types = [3 if i in control else 2 if i == 3 else 1 for i in range(vocab_size)]
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(pieces)
    writer.add_token_scores([-float(i) for i in range(vocab_size)])
    writer.add_token_types(types)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_chat_template(CHAT_TEMPLATE)
