"""SmolLM3 (SmolLM3ForCausalLM) on a tiny random checkpoint, float32: greedy tokens equal
transformers' on both attention backends, NoPE layers included (they step off the one-call
C++ decoder layer; the others keep it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixserve.kernels import ops
from radixserve.models.config import ModelConfig
from radixserve.models.smollm3 import uses_rope
from tests.helpers.family_check import (
    BACKENDS,
    engine_greedy,
    fused_layers,
    require_hf_arch,
    transformers_greedy,
)
from tests.helpers.tiny_models import make_tiny_checkpoint, tiny_hf_config

require_hf_arch("smollm3")

NO_ROPE_LAYERS = [1, 0, 1, 0]
PROMPTS = [[3, 5, 9, 30, 12], [4, *range(40, 52)], [6, *range(60, 100)]]


@pytest.fixture(scope="module")
def smollm3(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("smollm3")
    hf = make_tiny_checkpoint(folder, "smollm3", num_hidden_layers=4, no_rope_layers=NO_ROPE_LAYERS)
    return folder, hf


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_equals_transformers(smollm3: tuple, backend: str) -> None:
    folder, hf = smollm3
    assert engine_greedy(folder, PROMPTS, backend) == transformers_greedy(hf, PROMPTS)


def test_default_no_rope_layers_follow_the_interval() -> None:
    hf = tiny_hf_config("smollm3", num_hidden_layers=8)
    del hf.no_rope_layers  # a config without the list: every fourth layer is NoPE
    config = ModelConfig.from_hf_config(hf)
    assert [uses_rope(config, i) for i in range(8)] == [1, 1, 1, 0, 1, 1, 1, 0]
    assert tiny_hf_config("smollm3", num_hidden_layers=8).no_rope_layers == [1, 1, 1, 0] * 2


@pytest.mark.skipif(not ops.using_cpp_kernels(), reason="the C++ kernels are not built")
def test_only_rope_layers_run_as_one_cpp_call(smollm3: tuple) -> None:
    folder, _ = smollm3
    assert fused_layers(folder) == [bool(flag) for flag in NO_ROPE_LAYERS]


@pytest.mark.slow  # compiles the decode graph (~15 s on 2 cores)
def test_compiled_decode_equals_transformers(smollm3: tuple) -> None:
    """--enable-torch-compile: NoPE layers' attention is one opaque op too (no recompiles as
    contexts grow), and the tokens stay transformers'."""
    folder, hf = smollm3
    got = engine_greedy(
        folder, PROMPTS, "intel_amx", enable_torch_compile=True, torch_compile_max_bs=4
    )
    assert got == transformers_greedy(hf, PROMPTS)
