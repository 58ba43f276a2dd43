"""OLMoE (OlmoeForCausalLM) on tiny random checkpoints, float32: greedy tokens equal
transformers' on both attention backends (q/k norms over the full projection width, every MLP
a sparse block)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.family_check import (
    BACKENDS,
    engine_greedy,
    fused_layers,
    require_hf_arch,
    transformers_greedy,
)
from tests.helpers.tiny_models import make_tiny_checkpoint

require_hf_arch("olmoe")

PROMPTS = [[3, 5, 9, 30, 12], [4, *range(40, 52)], [6, *range(60, 100)]]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("olmoe")
    return folder, make_tiny_checkpoint(folder, "olmoe")


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_equals_transformers(checkpoint: tuple, backend: str) -> None:
    folder, hf = checkpoint
    assert engine_greedy(folder, PROMPTS, backend) == transformers_greedy(hf, PROMPTS)


def test_layers_run_module_by_module(checkpoint: tuple) -> None:
    folder, _ = checkpoint
    assert fused_layers(folder) == [False, False]
