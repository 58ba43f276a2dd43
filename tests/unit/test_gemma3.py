"""Gemma 3 (Gemma3ForCausalLM, gemma3_text) on tiny random checkpoints, float32: greedy tokens
equal transformers' on both attention backends over prompts longer than the 8-token sliding
window, with q/k norms, a RoPE base of their own on the sliding layers and linear RoPE scaling
on the global ones, also through the radix prefix cache and chunked prefill; the window is
really applied; attention scores stay uncapped as in transformers; the context length is the
config's max_position_embeddings (its linear factor already counted)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from radixserve.kernels import ops
from radixserve.layers.rotary_embedding import RotaryEmbedding
from radixserve.models.config import ModelConfig
from radixserve.models.loader import load_model
from tests.helpers.family_check import (
    BACKENDS,
    engine_greedy,
    fused_layers,
    require_hf_arch,
    transformers_greedy,
)
from tests.helpers.hf_reference import hf_logits
from tests.helpers.model_driver import ManualDriver
from tests.helpers.tiny_models import make_tiny_checkpoint, tiny_hf_config
from tests.helpers.window_check import (
    cached_chunked_greedy,
    engine_greedy_with_window,
    transformers_with_window,
)

require_hf_arch("gemma3")

PROMPTS = [[2, 5, 9, 30, 12], [2, *range(40, 60)], [2, *range(60, 100)]]
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
    "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 5000.0},
}
NO_WINDOW = 4096


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("gemma3")
    hf = make_tiny_checkpoint(
        folder, "gemma3", num_hidden_layers=4, layer_types=LAYER_TYPES, rope_parameters=ROPE
    )
    return folder, hf


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_equals_transformers(gemma3: tuple, backend: str) -> None:
    folder, hf = gemma3
    assert engine_greedy(folder, PROMPTS, backend) == transformers_greedy(hf, PROMPTS)


@pytest.mark.parametrize("backend", BACKENDS)
def test_window_is_applied(gemma3: tuple, backend: str) -> None:
    folder, _ = gemma3
    windowed = engine_greedy(folder, PROMPTS, backend)
    unwindowed = engine_greedy_with_window(folder, PROMPTS, backend, NO_WINDOW)
    assert windowed[0][:4] == unwindowed[0][:4]  # predicted from at most 8 positions
    assert all(w != u for w, u in zip(windowed, unwindowed, strict=True))
    assert unwindowed == transformers_greedy(transformers_with_window(folder, NO_WINDOW), PROMPTS)


@pytest.mark.parametrize("backend", BACKENDS)
def test_window_through_prefix_cache_and_chunked_prefill(gemma3: tuple, backend: str) -> None:
    folder, hf = gemma3
    first = PROMPTS[2]
    prompts = [first, [*first, 7, 8, 9, *range(100, 130)]]
    tokens, cached = cached_chunked_greedy(folder, prompts, backend, chunk=16)
    assert cached[0] == 0 and cached[1] >= len(first) - 1
    assert tokens == transformers_greedy(hf, prompts)


def test_sliding_layers_rotate_with_their_own_table(gemma3: tuple) -> None:
    """Sliding layers share a base-100 table; global ones the model's linearly scaled
    base-5000 one; logits equal transformers'."""
    folder, hf = gemma3
    loaded = load_model(str(folder), dtype="float32")
    body = loaded.model.model
    tables = [layer.self_attn.rotary_emb for layer in body.layers]
    assert tables[0] is tables[2] is body.local_rotary_emb
    assert tables[1] is tables[3] is body.rotary_emb
    dim = loaded.config.head_dim
    local = RotaryEmbedding(dim, dim, 64, 100.0).cos_sin_cache
    scaled = RotaryEmbedding(dim, dim, 64, 5000.0, {"rope_type": "linear", "factor": 4.0})
    assert torch.equal(body.local_rotary_emb.cos_sin_cache[:64], local)
    assert torch.equal(body.rotary_emb.cos_sin_cache[:64], scaled.cos_sin_cache)
    prompt = PROMPTS[2]
    ours = ManualDriver(loaded.model, loaded.config).forward([(0, prompt)], all_logits=True)
    assert torch.allclose(ours, hf_logits(hf, prompt), atol=1e-4)


def test_attention_softcapping_is_ignored_as_transformers_does(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hf = make_tiny_checkpoint(tmp_path, "gemma3", num_hidden_layers=2, attn_logit_softcapping=0.5)
    with caplog.at_level(logging.WARNING):
        loaded = load_model(str(tmp_path), dtype="float32")
    assert "does not soft-cap attention scores" in caplog.text
    assert all(layer.self_attn.attn.logit_cap is None for layer in loaded.model.model.layers)
    prompt = PROMPTS[1]
    ours = ManualDriver(loaded.model, loaded.config).forward([(0, prompt)], all_logits=True)
    assert torch.allclose(ours, hf_logits(hf, prompt), atol=1e-4)


@pytest.mark.skipif(not ops.using_cpp_kernels(), reason="the C++ kernels are not built")
def test_layers_run_module_by_module(gemma3: tuple) -> None:
    folder, _ = gemma3
    assert fused_layers(folder) == [False] * 4


def test_context_length_is_max_position_embeddings() -> None:
    """Gemma 3's 131072 already counts the factor 8 of its global layers' linear scaling."""
    hf = tiny_hf_config(
        "gemma3",
        max_position_embeddings=131072,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        },
    )
    config = ModelConfig.from_hf_config(hf)
    assert config.context_len == 131072
    assert config.rope_theta == 1e6
    assert config.rope_scaling == {"rope_type": "linear", "factor": 8.0}
