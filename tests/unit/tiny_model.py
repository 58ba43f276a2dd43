"""A tiny random Llama (config only, dummy weights) for fast engine tests."""

from __future__ import annotations

from pathlib import Path

TINY_VOCAB = 512


def write_tiny_llama(folder: Path, *, max_position_embeddings: int = 1024) -> Path:
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        architectures=["LlamaForCausalLM"],
    )
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    return folder
