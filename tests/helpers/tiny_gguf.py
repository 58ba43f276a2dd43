"""Write tiny GGUF files the way llama.cpp's converter does, from a tiny HF model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

_TOP = {
    "model.embed_tokens": "token_embd",
    "model.norm": "output_norm",
    "lm_head": "output",
}
_BLOCK = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
}
# A small byte-less BPE vocabulary: special tokens, letters and a few merges.
_TOKENS = ["<unk>", "<s>", "</s>"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
_TOKENS += [chr(c) for c in range(ord("A"), ord("Z") + 1)] + ["Ġ", "ab", "abc", "Ġa"]
_MERGES = ["a b", "ab c", "Ġ a"]
CHAT_TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's q/k row permutation (convert_hf_to_gguf.py, LlamaModel.permute)."""
    half = weight.shape[0] // num_heads // 2
    grouped = weight.reshape(num_heads, 2, half, *weight.shape[1:])
    return grouped.swapaxes(1, 2).reshape(weight.shape)


def gguf_name(hf_name: str) -> str:
    module, _, suffix = hf_name.rpartition(".")
    if module in _TOP:
        return f"{_TOP[module]}.{suffix}"
    parts = module.split(".")
    return f"blk.{parts[2]}.{_BLOCK['.'.join(parts[3:])]}.{suffix}"


def write_tiny_gguf(
    path: Path,
    hf_model: torch.nn.Module,
    arch: str = "llama",
    quantize: bool = True,
    stacked_experts: bool = True,
    tokens: tuple[list[str], list[str]] | None = None,
) -> Path:
    """Write `hf_model` (vocab_size must be len(_TOKENS) = 59 or less, unless `tokens` gives
    the vocabulary and its BPE merges) as a GGUF of `arch`.

    2-D weights other than the embedding (and a MoE model's 3-D stacked experts, not its router)
    are stored Q8_0 when `quantize`, else F32. q/k rows are permuted for llama, as llama.cpp
    does. `stacked_experts` False writes one tensor per expert (blk.N.ffn_gate.E.weight), as
    llama.cpp converted Mixtral before it stacked experts.
    """
    import gguf

    cfg = hf_model.config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{arch}")
    _add_model_metadata(writer, cfg, heads, kv_heads, head_dim, tokens)
    _add_moe_metadata(writer, cfg)
    for target, value in _gguf_tensors(hf_model, stacked_experts):
        if arch == "llama" and ".attn_q." in target:
            value = llama_cpp_permute(value, heads)
        elif arch == "llama" and ".attn_k." in target:
            value = llama_cpp_permute(value, kv_heads)
        # The MoE router stays F32, as llama.cpp's converter keeps it.
        if (
            quantize
            and value.ndim >= 2
            and not target.startswith("token_embd")
            and ".ffn_gate_inp" not in target
        ):
            q8 = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(target, gguf.quants.quantize(value, q8), raw_dtype=q8)
        else:
            writer.add_tensor(target, np.ascontiguousarray(value, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _gguf_tensors(
    hf_model: torch.nn.Module, stacked_experts: bool = True
) -> list[tuple[str, np.ndarray]]:
    """(GGUF name, float32 array) of every tensor llama.cpp's converter writes: MoE experts
    stacked as ffn_{gate,up,down}_exps [experts, rows, cols] (transformers keeps gate|up as one
    gate_up_proj), a shared-expert gate as a vector."""
    cfg = hf_model.config
    out = []
    for name, tensor in hf_model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        value = tensor.float().numpy()
        if name.endswith(".mlp.experts.gate_up_proj"):
            block = name.split(".")[2]
            gate, up = np.split(value, 2, axis=1)
            out += [(f"blk.{block}.ffn_gate_exps.weight", gate)]
            out += [(f"blk.{block}.ffn_up_exps.weight", up)]
        elif name.endswith(".mlp.experts.down_proj"):
            out.append((f"blk.{name.split('.')[2]}.ffn_down_exps.weight", value))
        elif name.endswith("shared_expert_gate.weight"):
            out.append((gguf_name(name), value.reshape(-1)))
        else:
            out.append((gguf_name(name), value))
    if not stacked_experts:
        out = [per_expert for item in out for per_expert in _unstacked(*item)]
    return [(n, np.ascontiguousarray(v)) for n, v in out]


def _unstacked(name: str, value: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """blk.N.ffn_gate_exps.weight [E, rows, cols] -> blk.N.ffn_gate.E.weight each."""
    base, _, suffix = name.rpartition(".")
    if not base.endswith("_exps"):
        return [(name, value)]
    stem = base.removesuffix("_exps")
    return [(f"{stem}.{e}.{suffix}", value[e]) for e in range(value.shape[0])]


def _add_moe_metadata(writer: object, cfg: object) -> None:
    """Expert counts and sizes, as llama.cpp's converter writes them (Mixtral: counts only,
    its feed_forward_length is the experts' size)."""
    experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    if not experts:
        return
    writer.add_expert_count(experts)
    writer.add_expert_used_count(cfg.num_experts_per_tok)
    if getattr(cfg, "moe_intermediate_size", None):
        writer.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    shared = getattr(cfg, "shared_expert_intermediate_size", None)
    if shared:
        writer.add_expert_shared_feed_forward_length(shared)


def _add_model_metadata(
    writer: object,
    cfg: object,
    heads: int,
    kv_heads: int,
    head_dim: int,
    tokens: tuple[list[str], list[str]] | None = None,
) -> None:
    """The hyperparameters and tokenizer llama.cpp's converter writes for a llama-like model."""
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_rope_dimension_count(head_dim)
    _add_tokenizer(writer, cfg.vocab_size, tokens)


def _add_tokenizer(
    writer: object, vocab_size: int, vocab: tuple[list[str], list[str]] | None = None
) -> None:
    if vocab is None:
        if vocab_size > len(_TOKENS):
            raise ValueError(f"tiny GGUF vocabularies hold at most {len(_TOKENS)} tokens")
        tokens, merges = _TOKENS[:vocab_size], _MERGES
    else:
        tokens, merges = vocab
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    # Special (control) tokens: the first three and any written "<...>".
    types = [
        3 if i < 3 or (t.startswith("<") and t.endswith(">")) else 1 for i, t in enumerate(tokens)
    ]
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(CHAT_TEMPLATE)


def random_blocks(qtype: int, rows: int, k: int, std: float = 0.08, seed: int = 0) -> torch.Tensor:
    """Random valid blocks of GGML `qtype` for a [rows, k] weight, their fp16 scales set so the
    dequantized weight has about `std` (any byte pattern is a valid block once its fp16 scales
    are finite): uint8 [rows, row bytes]."""
    from radixserve.kernels import gguf_dequant, gguf_types

    fmt = gguf_types.FORMATS[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, k // fmt.weights, fmt.bytes), dtype=np.uint8)
    for offset in gguf_types.FP16_FIELDS.get(qtype, ()):
        scale = rng.uniform(0.5, 1.5, size=raw.shape[:2]).astype(np.float16)
        raw[..., offset : offset + 2] = scale.view(np.uint8).reshape(*raw.shape[:2], 2)
    for offset in gguf_types.E8M0_FIELDS.get(qtype, ()):
        # A power-of-two scale byte near 2 ** -5 (MXFP4's largest code is 6).
        raw[..., offset] = rng.integers(118, 124, size=raw.shape[:2], dtype=np.uint8)
    blocks = torch.from_numpy(raw.reshape(rows, -1).copy())
    actual = gguf_dequant.dequantize_rows(blocks, qtype, rows).std().item()
    factor = std / actual
    for offset in gguf_types.FP16_FIELDS.get(qtype, ()):
        scale = raw[..., offset : offset + 2].copy().view(np.float16) * factor
        raw[..., offset : offset + 2] = scale.astype(np.float16).view(np.uint8)
    return torch.from_numpy(raw.reshape(rows, -1).copy())


def write_block_gguf(
    path: Path, hf_model: torch.nn.Module, types: dict[str, int], default_type: int
) -> Path:
    """Write a llama `hf_model` as a GGUF whose 2-D weights are random blocks of the GGML types
    named per tensor role in `types` (e.g. {"attn_v": Q6_K, "token_embd": Q6_K}; others
    `default_type`), and set `hf_model`'s weights to those blocks' dequantization, so the file
    and the model hold the same weights (transformers can then serve as the float reference).
    q/k block rows are permuted as llama.cpp's converter permutes the weights."""
    import gguf

    from radixserve.kernels import gguf_dequant

    cfg = hf_model.config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-blocks")
    _add_model_metadata(writer, cfg, heads, kv_heads, head_dim)
    state = hf_model.state_dict()
    for seed, (name, tensor) in enumerate(state.items()):
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        target = gguf_name(name)
        if tensor.dim() != 2:
            writer.add_tensor(target, np.ascontiguousarray(tensor.float().numpy()))
            continue
        role = target.split(".")[-2]
        qtype = types.get(role, default_type)
        rows, k = tensor.shape
        blocks = random_blocks(qtype, rows, k, seed=seed)
        with torch.no_grad():
            tensor.copy_(gguf_dequant.dequantize_rows(blocks, qtype, rows))
        stored = blocks.numpy()
        if role == "attn_q":
            stored = llama_cpp_permute(stored, heads)
        elif role == "attn_k":
            stored = llama_cpp_permute(stored, kv_heads)
        writer.add_tensor(
            target,
            np.ascontiguousarray(stored),
            raw_dtype=gguf.GGMLQuantizationType(qtype),
        )
    if cfg.tie_word_embeddings:
        hf_model.tie_weights()
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_block_moe_gguf(
    path: Path,
    hf_model: torch.nn.Module,
    arch: str,
    expert_types: dict[str, int],
    default_type: int,
) -> Path:
    """Write a Qwen2/3-MoE `hf_model` as a GGUF of `arch` whose experts are random blocks of the
    GGML types named per stacked tensor in `expert_types` (ffn_gate_exps, ffn_up_exps,
    ffn_down_exps) and whose other 2-D weights but the embedding and the router are random
    `default_type` blocks; `hf_model`'s weights are set to those blocks' dequantization, so
    transformers serves as the exact float reference for the file."""
    import gguf

    from radixserve.kernels import gguf_dequant

    cfg = hf_model.config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-blocks-{arch}")
    _add_model_metadata(writer, cfg, heads, kv_heads, head_dim)
    _add_moe_metadata(writer, cfg)

    def blocks_for(weight: torch.Tensor, qtype: int, seed: int) -> np.ndarray:
        """Random blocks for a [rows, k] slice of `weight`, copied back into it dequantized."""
        rows, k = weight.shape
        blocks = random_blocks(qtype, rows, k, seed=seed)
        with torch.no_grad():
            weight.copy_(gguf_dequant.dequantize_rows(blocks, qtype, rows))
        return blocks.numpy()

    seed = 0
    for name, tensor in hf_model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        seed += 1
        if tensor.dim() == 3:  # stacked experts: gate_up_proj [E, 2I, H] or down_proj [E, H, I]
            block = name.split(".")[2]
            if name.endswith("gate_up_proj"):
                halves = tensor.chunk(2, dim=1)
                parts = [("ffn_gate_exps", halves[0]), ("ffn_up_exps", halves[1])]
            else:
                parts = [("ffn_down_exps", tensor)]
            for role, stack in parts:
                qtype = expert_types.get(role, default_type)
                stored = np.stack(
                    [blocks_for(stack[e], qtype, seed * 100 + e) for e in range(stack.shape[0])]
                )
                writer.add_tensor(
                    f"blk.{block}.{role}.weight", stored, raw_dtype=gguf.GGMLQuantizationType(qtype)
                )
            continue
        target = gguf_name(name)
        if tensor.dim() != 2 or target.startswith("token_embd") or ".ffn_gate_inp" in target:
            writer.add_tensor(target, np.ascontiguousarray(tensor.float().numpy()))
            continue
        stored = blocks_for(tensor, default_type, seed)
        writer.add_tensor(
            target, np.ascontiguousarray(stored), raw_dtype=gguf.GGMLQuantizationType(default_type)
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
