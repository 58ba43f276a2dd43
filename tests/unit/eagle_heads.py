"""EAGLE / EAGLE3 draft-head checkpoints for tests, written as the EAGLE authors publish them
(SGLang's layout): config.json plus model.safetensors with un-prefixed tensor names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file


def _target_config(target_dir: Path) -> dict[str, Any]:
    return json.loads((target_dir / "config.json").read_text())


def _layer(
    prefix: str,
    hidden: int,
    heads: int,
    kv_heads: int,
    inter: int,
    qkv_in: int,
    gen: torch.Generator,
) -> dict[str, torch.Tensor]:
    head_dim = hidden // heads

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.05

    return {
        f"{prefix}.self_attn.q_proj.weight": rand(heads * head_dim, qkv_in),
        f"{prefix}.self_attn.k_proj.weight": rand(kv_heads * head_dim, qkv_in),
        f"{prefix}.self_attn.v_proj.weight": rand(kv_heads * head_dim, qkv_in),
        f"{prefix}.self_attn.o_proj.weight": rand(hidden, heads * head_dim),
        f"{prefix}.mlp.gate_proj.weight": rand(inter, hidden),
        f"{prefix}.mlp.up_proj.weight": rand(inter, hidden),
        f"{prefix}.mlp.down_proj.weight": rand(hidden, inter),
        f"{prefix}.post_attention_layernorm.weight": torch.ones(hidden),
    }


def write_eagle_head(
    folder: Path,
    target_dir: Path,
    *,
    seed: int = 0,
    tensors: dict[str, torch.Tensor] | None = None,
) -> Path:
    """A one-layer EAGLE-1 head for the target in `target_dir`: random weights, or `tensors`
    (checkpoint names) in their place. No embedding and no LM head: both are the target's."""
    cfg = _target_config(target_dir)
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    gen = torch.Generator().manual_seed(seed)
    weights = _layer(
        "layers.0", hidden, heads, cfg["num_key_value_heads"], cfg["intermediate_size"], hidden, gen
    )
    weights["fc.weight"] = torch.randn(hidden, 2 * hidden, generator=gen) * 0.05
    weights["fc.bias"] = torch.zeros(hidden)
    weights.update(tensors or {})
    config = {**cfg, "architectures": ["LlamaForCausalLMEagle"], "num_hidden_layers": 1}
    return _save(folder, config, weights)


def write_eagle3_head(
    folder: Path,
    target_dir: Path,
    *,
    seed: int = 0,
    draft_vocab: int | None = None,
    aux_layer_ids: list[int] | None = None,
) -> Path:
    """A random EAGLE3 head; with `draft_vocab`, an LM head over that many target tokens (every
    other id, through d2t)."""
    cfg = _target_config(target_dir)
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    gen = torch.Generator().manual_seed(seed)
    weights = _layer(
        "midlayer",
        hidden,
        heads,
        cfg["num_key_value_heads"],
        cfg["intermediate_size"],
        2 * hidden,
        gen,
    )
    weights["midlayer.input_layernorm.weight"] = torch.ones(hidden)
    weights["midlayer.hidden_norm.weight"] = torch.ones(hidden)
    weights["norm.weight"] = torch.ones(hidden)
    weights["fc.weight"] = torch.randn(hidden, 3 * hidden, generator=gen) * 0.05
    vocab = cfg["vocab_size"]
    size = draft_vocab or vocab
    weights["lm_head.weight"] = torch.randn(size, hidden, generator=gen) * 0.05
    config = {
        **cfg,
        "architectures": ["LlamaForCausalLMEagle3"],
        "num_hidden_layers": 1,
        "tie_word_embeddings": False,
        "draft_vocab_size": size,
    }
    if draft_vocab is not None:
        target_ids = torch.arange(size, dtype=torch.int64) * (vocab // size)
        weights["d2t"] = target_ids - torch.arange(size, dtype=torch.int64)
    if aux_layer_ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux_layer_ids}
    return _save(folder, config, weights)


def _save(folder: Path, config: dict[str, Any], weights: dict[str, torch.Tensor]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))
    return folder


def write_bigram_target(folder: Path, *, seed: int = 0) -> tuple[Path, dict[str, torch.Tensor]]:
    """A one-layer tiny Llama whose next token depends on the current token only (o_proj is
    zero, so attention adds nothing), with unit-RMS embedding rows and unit norm weights (so its
    input norm is the identity) and an untied LM head. Returns the folder and its tensors."""
    from tests.unit.tiny_model import write_tiny_llama

    write_tiny_llama(folder, num_hidden_layers=1, tie_word_embeddings=False, rms_norm_eps=1e-12)
    cfg = _target_config(folder)
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    gen = torch.Generator().manual_seed(seed)
    layer = _layer(
        "model.layers.0",
        hidden,
        heads,
        cfg["num_key_value_heads"],
        cfg["intermediate_size"],
        hidden,
        gen,
    )
    layer["model.layers.0.self_attn.o_proj.weight"].zero_()
    # A stronger MLP, so the next token is not just the current one again.
    for name in ("gate_proj", "up_proj", "down_proj"):
        layer[f"model.layers.0.mlp.{name}.weight"] *= 10
    embed = torch.randn(cfg["vocab_size"], hidden, generator=gen)
    embed /= embed.pow(2).mean(-1, keepdim=True).sqrt()
    weights = {
        **layer,
        "model.embed_tokens.weight": embed,
        "model.layers.0.input_layernorm.weight": torch.ones(hidden),
        "model.norm.weight": torch.ones(hidden),
        "lm_head.weight": torch.randn(cfg["vocab_size"], hidden, generator=gen),
    }
    save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))
    return folder, weights


def bigram_oracle_head(folder: Path, target_dir: Path, target: dict[str, torch.Tensor]) -> Path:
    """The EAGLE-1 head that predicts write_bigram_target's next token exactly: fc passes the
    embedding through ([I | 0]), and its layer is the target's (whose input norm was the
    identity anyway). Its logits (the target's LM head on the un-normed output) differ from the
    target's by a positive factor per row, so every greedy draft is the target's token."""
    hidden = target["model.norm.weight"].numel()
    tensors = {
        name.removeprefix("model."): t
        for name, t in target.items()
        if name.startswith("model.layers.0.") and "input_layernorm" not in name
    }
    tensors["fc.weight"] = torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1)
    tensors["fc.bias"] = torch.zeros(hidden)
    return write_eagle_head(folder, target_dir, tensors=tensors)
