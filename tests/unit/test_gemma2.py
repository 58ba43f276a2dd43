"""Gemma 2 (Gemma2ForCausalLM) on tiny random checkpoints, float32: greedy tokens equal
transformers' on both attention backends over prompts longer than the 8-token sliding window
(every other layer slides; attention scores and logits soft-capped at values that bite), also
through the radix prefix cache and chunked prefill; the window is really applied (the same
weights without it give other tokens, transformers' tokens either way); Gemma's norm and
embedding scale round as transformers' do in bfloat16; no layer takes the one-call C++ path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixserve.kernels import ops
from radixserve.layers.layernorm import GemmaRMSNorm
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
from tests.helpers.tiny_models import make_tiny_checkpoint, tiny_hf_model
from tests.helpers.window_check import (
    cached_chunked_greedy,
    engine_greedy_with_window,
    transformers_with_window,
)

require_hf_arch("gemma2")

# The first prompt fits in the window; the others reach 2.5x and 5x past it.
PROMPTS = [[2, 5, 9, 30, 12], [2, *range(40, 60)], [2, *range(60, 100)]]
CAPS = {"attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0}
NO_WINDOW = 4096  # longer than any sequence here


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("gemma2")
    return folder, make_tiny_checkpoint(folder, "gemma2", num_hidden_layers=4, **CAPS)


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_equals_transformers(gemma2: tuple, backend: str) -> None:
    folder, hf = gemma2
    assert hf.config.layer_types[:2] == ["sliding_attention", "full_attention"]
    assert engine_greedy(folder, PROMPTS, backend) == transformers_greedy(hf, PROMPTS)


@pytest.mark.parametrize("backend", BACKENDS)
def test_window_is_applied(gemma2: tuple, backend: str) -> None:
    """The same weights without a window give other tokens (transformers' for that model)
    once sequences pass the window."""
    folder, _ = gemma2
    windowed = engine_greedy(folder, PROMPTS, backend)
    unwindowed = engine_greedy_with_window(folder, PROMPTS, backend, NO_WINDOW)
    # Tokens predicted from at most 8 positions (the 5-token prompt and 3 more) see no
    # difference; past that, the window masks.
    assert windowed[0][:4] == unwindowed[0][:4]
    assert all(w != u for w, u in zip(windowed, unwindowed, strict=True))
    assert unwindowed == transformers_greedy(transformers_with_window(folder, NO_WINDOW), PROMPTS)


@pytest.mark.parametrize("backend", BACKENDS)
def test_window_through_prefix_cache_and_chunked_prefill(gemma2: tuple, backend: str) -> None:
    """Prefill chunks of 16 tokens cross the 8-token window; the second prompt extends the
    first, whose KV the radix cache serves."""
    folder, hf = gemma2
    first = PROMPTS[2]
    prompts = [first, [*first, 7, 8, 9, *range(100, 130)]]
    tokens, cached = cached_chunked_greedy(folder, prompts, backend, chunk=16)
    assert cached[0] == 0 and cached[1] >= len(first) - 1
    assert tokens == transformers_greedy(hf, prompts)


def test_soft_capping_is_applied(gemma2: tuple) -> None:
    """Logits equal transformers' with the caps, and are far from the uncapped model's."""
    folder, hf = gemma2
    loaded = load_model(str(folder), dtype="float32")
    prompt = PROMPTS[2]
    ours = ManualDriver(loaded.model, loaded.config).forward([(0, prompt)], all_logits=True)
    assert torch.allclose(ours, hf_logits(hf, prompt), atol=1e-4)
    uncapped = tiny_hf_model(hf.config.__class__(**{**hf.config.to_dict(), **dict.fromkeys(CAPS)}))
    uncapped.load_state_dict(hf.state_dict())
    assert float((ours - hf_logits(uncapped, prompt)).abs().max()) > 0.5


@pytest.mark.skipif(not ops.using_cpp_kernels(), reason="the C++ kernels are not built")
def test_layers_run_module_by_module(gemma2: tuple) -> None:
    folder, _ = gemma2
    assert fused_layers(folder) == [False] * 4


@pytest.mark.parametrize("fast", [False, True])
def test_norm_equals_transformers_in_float32_and_bfloat16(fast: bool) -> None:
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm

    torch.manual_seed(0)
    ours, theirs = GemmaRMSNorm(64, 1e-6), Gemma2RMSNorm(64, 1e-6)
    with torch.no_grad():
        theirs.weight.normal_(0.0, 0.5)
        ours.weight.copy_(theirs.weight)
    ours.use_fast_kernels = fast
    x = torch.randn(5, 64) * 3
    assert torch.allclose(ours(x), theirs(x), atol=1e-6)
    # bfloat16: scaled in float32 before the cast, unlike Llama's norm (PyTorch path).
    ours16, theirs16 = ours.to(torch.bfloat16), theirs.to(torch.bfloat16)
    assert torch.equal(ours16(x.bfloat16()), theirs16(x.bfloat16()))
    summed, residual = ours16(x.bfloat16(), torch.ones(5, 64, dtype=torch.bfloat16))
    assert torch.equal(residual, x.bfloat16() + 1)
    assert torch.equal(summed, theirs16(x.bfloat16() + 1))


def test_embedding_scale_rounds_to_the_model_dtype(tmp_path: Path) -> None:
    """sqrt(48) = 6.928 is 6.9375 in bfloat16; transformers multiplies by that."""
    hf = make_tiny_checkpoint(tmp_path, "gemma2", hidden_size=48, num_hidden_layers=1)
    ours = load_model(str(tmp_path), dtype="bfloat16").model.model
    ids = torch.arange(0, 256)
    theirs = hf.to(torch.bfloat16).model.embed_tokens(ids)
    assert torch.equal(ours.embed(ids), theirs)
    unrounded = ours.embed_tokens(ids) * 48**0.5
    assert not torch.equal(unrounded, theirs)  # the rounding matters for this table


def test_bidirectional_config_is_refused(tmp_path: Path) -> None:
    make_tiny_checkpoint(tmp_path, "gemma2", num_hidden_layers=1, use_bidirectional_attention=True)
    with pytest.raises(ValueError, match="bidirectional"):
        load_model(str(tmp_path), dtype="float32")


@pytest.mark.slow  # compiles the decode graph (~15 s on 2 cores)
def test_compiled_decode_equals_transformers(gemma2: tuple) -> None:
    """--enable-torch-compile: the opaque attention op keeps the window and the caps."""
    folder, hf = gemma2
    got = engine_greedy(
        folder, PROMPTS, "intel_amx", enable_torch_compile=True, torch_compile_max_bs=4
    )
    assert got == transformers_greedy(hf, PROMPTS)
