"""A tiny random Llama (config only, dummy weights) for fast engine tests."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

TINY_VOCAB = 512


def write_tiny_llama(
    folder: Path, *, max_position_embeddings: int = 1024, **overrides: Any
) -> Path:
    """`overrides` replace config fields (another vocabulary, fewer layers, ...)."""
    from transformers import LlamaConfig

    fields: dict[str, Any] = {
        "vocab_size": TINY_VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "architectures": ["LlamaForCausalLM"],
    }
    config = LlamaConfig(**{**fields, **overrides})
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    return folder


def make_tiny_engine(model_dir: Path, **kwargs: Any) -> Any:
    """A thread-runtime Engine on dummy weights, token ids in and out, checking its KV
    bookkeeping after every step; `kwargs` override the defaults."""
    from radixserve import Engine

    options: dict[str, Any] = {
        "runtime": "thread",
        "model_path": str(model_dir),
        "load_format": "dummy",
        "dtype": "float32",
        "skip_tokenizer_init": True,
        "max_total_tokens": 4096,
        "random_seed": 0,
    }
    options.update(kwargs)
    engine = Engine(**options)
    engine.scheduler.check_kv_each_step = True
    return engine


@contextlib.contextmanager
def tiny_engines(model_dir: Path, **defaults: Any) -> Iterator[Callable[..., Any]]:
    """A factory of make_tiny_engine engines (with `defaults`), all shut down on exit."""
    engines: list[Any] = []

    def factory(**kwargs: Any) -> Any:
        engine = make_tiny_engine(model_dir, **{**defaults, **kwargs})
        engines.append(engine)
        return engine

    try:
        yield factory
    finally:
        for engine in engines:
            engine.shutdown()
