"""Phi-3 / Phi-4-mini (Phi3ForCausalLM) on tiny random checkpoints, float32: greedy tokens equal
transformers' on both attention backends; fused qkv/gate_up tensors load; LongRoPE picks the
short or long table per request; partial rotary (Phi-4-mini) rotates only part of each head."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve.kernels import ops
from radixserve.layers.longrope import LongRopeEmbedding
from radixserve.layers.rotary_embedding import get_rope
from radixserve.models.config import ModelConfig
from radixserve.models.loader import load_model
from tests.helpers.family_check import (
    BACKENDS,
    engine_greedy,
    fused_layers,
    require_hf_arch,
    transformers_greedy,
)
from tests.helpers.model_driver import ManualDriver
from tests.helpers.tiny_models import make_tiny_checkpoint, tiny_hf_config

require_hf_arch("phi3")

ORIGINAL = 32  # the tiny LongRoPE model's pretraining length
# Phi-4-mini's shape in small: LongRoPE, 3/4 of each head rotating (12 of 16 dims: 6 factors),
# tied embeddings.
PHI4_MINI = {
    "max_position_embeddings": 128,
    "original_max_position_embeddings": ORIGINAL,
    "partial_rotary_factor": 0.75,
    "tie_word_embeddings": True,
    "rope_scaling": {
        "rope_type": "longrope",
        "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
        "long_factor": [1.5, 2.5, 4.0, 6.0, 9.0, 13.0],
    },
}
# Within the pretraining length with their new tokens, and one prompt beyond it (long set).
SHORT_PROMPTS = [[3, 5, 9, 30, 12], [4, *range(40, 52)]]
LONG_PROMPT = [6, *range(60, 100)]


@pytest.fixture(scope="module")
def phi3(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("phi3")
    return folder, make_tiny_checkpoint(folder, "phi3")


@pytest.fixture(scope="module")
def phi4_mini(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("phi4-mini")
    return folder, make_tiny_checkpoint(folder, "phi3", **PHI4_MINI)


@pytest.mark.parametrize("backend", BACKENDS)
def test_phi3_greedy_equals_transformers(phi3: tuple, backend: str) -> None:
    folder, hf = phi3
    prompts = [*SHORT_PROMPTS, LONG_PROMPT]
    assert engine_greedy(folder, prompts, backend) == transformers_greedy(hf, prompts)


@pytest.mark.parametrize("backend", BACKENDS)
def test_phi4_mini_longrope_greedy_equals_transformers(phi4_mini: tuple, backend: str) -> None:
    """Short and long requests in the same batches: each reads its own table."""
    folder, hf = phi4_mini
    prompts = [*SHORT_PROMPTS, LONG_PROMPT]
    assert engine_greedy(folder, prompts, backend) == transformers_greedy(hf, prompts)


def test_longrope_tables_match_transformers() -> None:
    from transformers import Phi3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = Phi3Config(hidden_size=64, num_attention_heads=4, **PHI4_MINI)
    init = ROPE_INIT_FUNCTIONS["longrope"]
    short, scale = init(config, "cpu")
    long, _ = init(config, "cpu", seq_len=ORIGINAL + 1)
    rope = get_rope(16, 12, 100, 10000.0, dict(PHI4_MINI["rope_scaling"], **_original()), 128)
    assert isinstance(rope, LongRopeEmbedding)
    positions = torch.arange(100, dtype=torch.float32)
    for inv_freq, rows in ((short, slice(0, ORIGINAL)), (long, slice(ORIGINAL, ORIGINAL + 100))):
        freqs = positions[: rows.stop - rows.start, None] * inv_freq[None, :]
        want = torch.cat([freqs.cos() * scale, freqs.sin() * scale], dim=-1)
        assert torch.equal(rope.cos_sin_cache[rows], want)
    assert scale > 1.0  # stretched 4x: cos and sin are scaled up


def _original() -> dict[str, Any]:
    return {"original_max_position_embeddings": ORIGINAL}


def _batch(decode: bool, seq_lens: list[int], extend: list[int]) -> Any:
    """The fields of a ForwardBatch that table_rows reads."""
    from types import SimpleNamespace

    from radixserve.model_executor.forward_batch import ForwardMode

    positions = [p for n, e in zip(seq_lens, extend, strict=True) for p in range(n - e, n)]
    return SimpleNamespace(
        forward_mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND,
        positions=torch.tensor(positions),
        seq_lens_cpu=seq_lens,
        extend_seq_lens_cpu=extend,
    )


def test_longrope_rows_per_request() -> None:
    """Extend: by each request's length after the step; decode: by the token's position."""
    rope = get_rope(16, 12, 100, 10000.0, dict(PHI4_MINI["rope_scaling"], **_original()), 128)
    mixed = _batch(decode=False, seq_lens=[10, 40, ORIGINAL + 1], extend=[3, 2, ORIGINAL + 1])
    want = [7, 8, 9, 38 + ORIGINAL, 39 + ORIGINAL, *[p + ORIGINAL for p in range(ORIGINAL + 1)]]
    assert rope.table_rows(mixed.positions, mixed).tolist() == want
    short = _batch(decode=False, seq_lens=[ORIGINAL, 5], extend=[4, 5])
    assert torch.equal(rope.table_rows(short.positions, short), short.positions)
    decode = _batch(decode=True, seq_lens=[ORIGINAL, ORIGINAL + 1], extend=[1, 1])
    assert rope.table_rows(decode.positions, decode).tolist() == [ORIGINAL - 1, 2 * ORIGINAL]


@torch.inference_mode()
def test_decoding_past_the_pretraining_length_keeps_cached_keys(phi4_mini: tuple) -> None:
    """Growing past the pretraining length, new tokens rotate with the long set while the
    cached keys keep the short one: transformers' model stepped with its cache (not generate,
    which would recompute the whole sequence) does the same."""
    folder, hf = phi4_mini
    loaded = load_model(str(folder), dtype="float32")
    driver = ManualDriver(loaded.model, loaded.config, max_tokens=256)
    prompt = [7, *range(100, 129)]  # 30 tokens
    steps = [5, 6, 7, 8]  # positions 30..33: crosses ORIGINAL = 32
    ours = [driver.forward([(0, prompt)])[0]]
    ours += [driver.forward([(0, [t])], decode=True)[0] for t in steps]
    # transformers renames past_key_values to cache (5.x); either is the same KV cache.
    cache_arg = (
        "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    )
    out = hf(torch.tensor([prompt]), use_cache=True)
    ref = [out.logits[0, -1]]
    for token in steps:
        out = hf(torch.tensor([[token]]), use_cache=True, **{cache_arg: out.past_key_values})
        ref.append(out.logits[0, -1])
    for got, want in zip(ours, ref, strict=True):
        assert torch.allclose(got, want, atol=1e-4)


def test_fused_checkpoint_tensors_are_split_on_load(phi3: tuple) -> None:
    folder, hf = phi3
    model = load_model(str(folder), dtype="float32").model
    ours = model.model.layers[1]
    theirs = hf.model.layers[1]
    assert torch.equal(ours.self_attn.qkv_proj.weight, theirs.self_attn.qkv_proj.weight)
    assert torch.equal(ours.mlp.gate_up_proj.weight, theirs.mlp.gate_up_proj.weight)


@pytest.mark.skipif(not ops.using_cpp_kernels(), reason="the C++ kernels are not built")
def test_phi3_layers_run_as_one_cpp_call(phi4_mini: tuple) -> None:
    """Llama-shaped: LongRoPE and partial rotary stay on the one-call C++ decoder layer."""
    folder, _ = phi4_mini
    assert fused_layers(folder) == [True, True]


def test_config_normalises_partial_rotary_and_longrope(caplog: pytest.LogCaptureFixture) -> None:
    config = ModelConfig.from_hf_config(tiny_hf_config("phi3", **PHI4_MINI))
    assert (config.head_dim, config.rotary_dim) == (16, 12)
    assert config.rope_scaling is not None
    assert config.rope_scaling["rope_type"] == "longrope"
    assert config.rope_scaling["original_max_position_embeddings"] == ORIGINAL
    assert "partial_rotary_factor" not in config.rope_scaling
    assert config.context_len == 128  # max_position_embeddings already holds the stretch
    assert "sliding-window" not in caplog.text
