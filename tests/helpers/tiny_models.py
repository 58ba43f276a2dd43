"""Tiny random Hugging Face checkpoints (2 layers, hidden 64) for fast CPU tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

_BASE: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.1,
    "tie_word_embeddings": False,
    "eos_token_id": 2,
    "bos_token_id": 1,
}

ARCHS = ("llama", "qwen2", "qwen3", "mistral")
# Config class names in transformers, imported by name so a missing one skips only its tests.
_CONFIG_CLASSES = {
    "llama": "LlamaConfig",
    "qwen2": "Qwen2Config",
    "qwen3": "Qwen3Config",
    "mistral": "MistralConfig",
    "phi3": "Phi3Config",
    "smollm3": "SmolLM3Config",
    "olmo2": "Olmo2Config",
    "granite": "GraniteConfig",
    "gemma2": "Gemma2Config",
    "gemma3": "Gemma3TextConfig",
    "qwen3_moe": "Qwen3MoeConfig",
    "mixtral": "MixtralConfig",
    "qwen2_moe": "Qwen2MoeConfig",
    "olmoe": "OlmoeConfig",
    "gpt_oss": "GptOssConfig",
    "deepseek_v2": "DeepseekV2Config",
}
# Mixture-of-experts shapes: 8 tiny experts, 2 per token (tested in their own files).
_MOE: dict[str, dict[str, Any]] = {
    "qwen3_moe": {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    "mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None},
    "qwen2_moe": {
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 64,
    },
    "olmoe": {"num_experts": 8, "num_experts_per_tok": 2, "pad_token_id": 0},
    # MLA with a 32-dim latent and 8 rotated dims; layer 0 dense, 8 experts in 4 groups.
    "deepseek_v2": {
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "n_shared_experts": 2,
        "first_k_dense_replace": 1,
        "kv_lora_rank": 32,
        "q_lora_rank": 48,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 12,
        "num_key_value_heads": 4,
        "topk_method": "group_limited_greedy",
        "n_group": 4,
        "topk_group": 2,
        "routed_scaling_factor": 1.5,
        "norm_topk_prob": False,
    },
    # An 8-token window on every other layer, and YaRN stretching a 128-token pretraining
    # length 4x, so both act within a test's sequences.
    "gpt_oss": {
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "intermediate_size": 32,
        "head_dim": 16,
        "sliding_window": 8,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 4.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 128,
        },
    },
}


def hf_config_class(arch: str) -> Any:
    """transformers' config class for `arch`, or None where this transformers lacks it."""
    import transformers

    return getattr(transformers, _CONFIG_CLASSES[arch], None)


def tiny_hf_config(arch: str = "llama", **overrides: Any) -> Any:
    """A transformers config for a tiny model of `arch` (ARCHS, or phi3, smollm3, olmo2,
    granite, gemma2, gemma3 and the MoE families, each tested in its own file)."""
    config_class = hf_config_class(arch)
    if config_class is None:
        raise ValueError(f"this transformers has no {_CONFIG_CLASSES[arch]}")
    kwargs = dict(_BASE)
    kwargs.update(_MOE.get(arch, {}))
    if arch in ("qwen3", "mistral", "gemma2", "gemma3", "qwen3_moe"):
        kwargs["head_dim"] = 16
    if arch in ("gemma2", "gemma3"):
        # Gemma ties its embeddings; its own defaults (a 4096-token window, a softmax scale of
        # 256 ** -0.5) would leave both untested on a tiny model.
        kwargs.update(tie_word_embeddings=True, sliding_window=8, query_pre_attn_scalar=16)
    if arch == "mistral":
        kwargs["sliding_window"] = None
    if arch in ("phi3", "smollm3", "olmo2"):
        kwargs["pad_token_id"] = 0  # their defaults lie outside the tiny vocabulary
    kwargs.update(overrides)
    return config_class(**kwargs)


def tiny_hf_model(config: Any, seed: int = 0) -> torch.nn.Module:
    """An HF causal LM with random weights, norms and biases included (HF inits those to 1/0,
    which would leave their loading untested)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                param.normal_(0.0, 0.1)
    return model.eval()


def make_tiny_checkpoint(
    out_dir: Path, arch: str = "llama", seed: int = 0, **config_overrides: Any
) -> torch.nn.Module:
    """Save a tiny random model of `arch` to out_dir (safetensors) and return the HF model."""
    model = tiny_hf_model(tiny_hf_config(arch, **config_overrides), seed)
    model.save_pretrained(out_dir)
    return model


def save_word_tokenizer(folder: Path, vocab_size: int = 256) -> None:
    """A word-level tokenizer ("w<i>" is token i; bos w1, eos w2) saved into `folder`, so a
    tiny checkpoint can serve text over HTTP."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="w0", bos_token="w1", eos_token="w2"
    )
    fast.save_pretrained(folder)
