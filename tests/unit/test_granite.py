"""Granite (GraniteForCausalLM) on tiny random checkpoints, float32: greedy tokens equal
transformers' on both attention backends with its four multipliers; a residual_multiplier
other than 1 steps off the one-call C++ decoder layer, the other three keep it."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixserve.kernels import ops
from tests.helpers.family_check import (
    BACKENDS,
    engine_greedy,
    fused_layers,
    require_hf_arch,
    transformers_greedy,
)
from tests.helpers.tiny_models import make_tiny_checkpoint

require_hf_arch("granite")

PROMPTS = [[3, 5, 9, 30, 12], [4, *range(40, 52)], [6, *range(60, 100)]]
# Granite-3-like values: attention scaled by 1 / head_dim, logits divided down.
SCALED = {
    "embedding_multiplier": 12.0,
    "attention_multiplier": 1 / 16,
    "logits_scaling": 4.0,
}
CONFIGS = {
    "all-multipliers": {**SCALED, "residual_multiplier": 0.22},
    "residual-1": {**SCALED, "residual_multiplier": 1.0},
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def granite(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    folder = tmp_path_factory.mktemp(f"granite-{request.param}")
    hf = make_tiny_checkpoint(folder, "granite", **CONFIGS[request.param])
    return request.param, folder, hf


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_equals_transformers(granite: tuple, backend: str) -> None:
    _, folder, hf = granite
    assert engine_greedy(folder, PROMPTS, backend) == transformers_greedy(hf, PROMPTS)


@pytest.mark.skipif(not ops.using_cpp_kernels(), reason="the C++ kernels are not built")
def test_only_unscaled_residuals_run_as_one_cpp_call(granite: tuple) -> None:
    name, folder, _ = granite
    assert fused_layers(Path(folder)) == [name == "residual-1"] * 2
