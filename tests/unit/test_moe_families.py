"""Mixtral, Qwen2-MoE and OLMoE on tiny random checkpoints, float32: greedy tokens equal
transformers' on both attention backends, and their layers run module by module (the one-call
C++ layer has dense MLPs only). What each family adds to the sparse block:
- Mixtral (MixtralForCausalLM): every MLP sparse, top-2 renormalized; the checkpoint names the
  block block_sparse_moe and the experts w1/w3/w2;
- Qwen2-MoE (Qwen2MoeForCausalLM): routed experts not renormalized, plus the shared expert
  scaled by its sigmoid gate; q/k/v biases;
- OLMoE (OlmoeForCausalLM): q/k norms over the full projection width, every MLP sparse.
(Qwen3-MoE has its own file, test_qwen3_moe.py.)"""

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

PROMPTS = [[3, 5, 9, 30, 12], [4, *range(40, 52)], [6, *range(60, 100)]]


@pytest.fixture(scope="module", params=("mixtral", "qwen2_moe", "olmoe"))
def checkpoint(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, torch.nn.Module]:
    arch = request.param
    require_hf_arch(arch)
    folder = tmp_path_factory.mktemp(arch)
    return folder, make_tiny_checkpoint(folder, arch)


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_equals_transformers(checkpoint: tuple, backend: str) -> None:
    folder, hf = checkpoint
    assert engine_greedy(folder, PROMPTS, backend) == transformers_greedy(hf, PROMPTS)


def test_layers_run_module_by_module(checkpoint: tuple) -> None:
    folder, _ = checkpoint
    assert fused_layers(folder) == [False, False]
