"""Greedy tokens of a tiny checkpoint through the whole engine and through transformers, and a
look at which decoder layers took the one-call C++ path: the checks every model family runs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve import Engine
from radixserve.layers.fast_path import use_fast_kernels
from radixserve.models.loader import load_model
from tests.helpers.hf_reference import hf_greedy
from tests.helpers.tiny_models import hf_config_class

BACKENDS = ("intel_amx", "torch_native")
NEW_TOKENS = 10


def require_hf_arch(arch: str) -> None:
    """Skip the calling test module where this transformers lacks the family's classes."""
    if hf_config_class(arch) is None:
        pytest.skip(f"transformers {__import__('transformers').__version__} has no {arch}")


def transformers_greedy(
    hf: torch.nn.Module, prompts: Sequence[Sequence[int]], new_tokens: int = NEW_TOKENS
) -> list[list[int]]:
    return [hf_greedy(hf, prompt, new_tokens) for prompt in prompts]


def engine_greedy(
    model_dir: Path,
    prompts: Sequence[Sequence[int]],
    backend: str,
    new_tokens: int = NEW_TOKENS,
    **engine_args: Any,
) -> list[list[int]]:
    """The engine's greedy tokens for `prompts` submitted together (one batch), float32."""
    with Engine(
        model_path=str(model_dir),
        runtime="thread",
        dtype="float32",
        skip_tokenizer_init=True,
        skip_server_warmup=True,
        max_total_tokens=2048,
        attention_backend=backend,
        **engine_args,
    ) as engine:
        outs = engine.generate(
            input_ids=[list(p) for p in prompts],
            sampling_params={"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True},
        )
    return [out["output_ids"] for out in outs]


def fused_layers(model_dir: Path) -> list[bool]:
    """For each decoder layer, whether the fast path gave it the one-call C++ form."""
    model = load_model(str(model_dir), dtype="float32").model
    use_fast_kernels(model, True)
    return [getattr(layer, "fused_args", None) is not None for layer in model.model.layers]
