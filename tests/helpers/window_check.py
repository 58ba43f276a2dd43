"""Sliding-window checks of a tiny checkpoint: the same weights with another window (ours
through --json-model-override-args, transformers' through its config), and greedy tokens
through the radix prefix cache and chunked prefill."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from radixserve import Engine
from tests.helpers.family_check import NEW_TOKENS, engine_greedy

GREEDY = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}


def engine_greedy_with_window(
    model_dir: Path, prompts: Sequence[Sequence[int]], backend: str, window: int
) -> list[list[int]]:
    """The engine's greedy tokens with the checkpoint's sliding_window replaced by `window`."""
    overrides = json.dumps({"sliding_window": window})
    return engine_greedy(model_dir, prompts, backend, json_model_override_args=overrides)


def transformers_with_window(model_dir: Path, window: int) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_dir, sliding_window=window, dtype=torch.float32
    )
    return model.eval()


def cached_chunked_greedy(
    model_dir: Path, prompts: Sequence[Sequence[int]], backend: str, chunk: int
) -> tuple[list[list[int]], list[int]]:
    """Greedy tokens of `prompts` sent one after another to one engine whose prefills run in
    chunks of `chunk` tokens, and how many prompt tokens of each came from the radix cache."""
    tokens: list[list[int]] = []
    cached: list[int] = []
    args: dict[str, Any] = {"chunked_prefill_size": chunk, "attention_backend": backend}
    with Engine(
        model_path=str(model_dir),
        runtime="thread",
        dtype="float32",
        skip_tokenizer_init=True,
        skip_server_warmup=True,
        max_total_tokens=2048,
        **args,
    ) as engine:
        for prompt in prompts:
            out = engine.generate(input_ids=list(prompt), sampling_params=GREEDY)
            tokens.append(out["output_ids"])
            cached.append(out["meta_info"]["cached_tokens"])
    return tokens, cached
