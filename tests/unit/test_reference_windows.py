"""Mistral and Phi-3 models whose config sets a sliding window shorter than the context
(Mistral 7B v0.1's 4096, Phi-3-mini-4k's 2047): transformers applies it to every layer, and so
do we. Tiny random checkpoints with an 8-token window, float32: greedy tokens equal
transformers' on both attention backends for prompts up to 5x the window, through the radix
cache and chunked prefill; the window really masks; the one-call C++ layers stay on and run the
batches the window cannot mask."""

from __future__ import annotations

import logging

import pytest

from radixserve.kernels import ops
from radixserve.layers import fused_decoder
from radixserve.models.config import ModelConfig
from radixserve.models.loader import load_model
from tests.helpers.family_check import (
    BACKENDS,
    engine_greedy,
    fused_layers,
    require_hf_arch,
    transformers_greedy,
)
from tests.helpers.tiny_models import make_tiny_checkpoint, tiny_hf_config
from tests.helpers.window_check import (
    cached_chunked_greedy,
    engine_greedy_with_window,
    transformers_with_window,
)

WINDOW = 8
NO_WINDOW = 4096  # longer than any sequence here
# The first prompt and its new tokens fit in the window; the others reach 2.5x and 5x past it.
PROMPTS = [[2, 5, 9], [2, *range(40, 60)], [2, *range(60, 100)]]
ARCHS = ("mistral", "phi3")


@pytest.fixture(scope="module", params=ARCHS)
def windowed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    arch = request.param
    require_hf_arch(arch)
    folder = tmp_path_factory.mktemp(f"{arch}-window")
    hf = make_tiny_checkpoint(folder, arch, sliding_window=WINDOW, max_position_embeddings=256)
    return folder, hf


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_equals_transformers(windowed: tuple, backend: str) -> None:
    folder, hf = windowed
    assert hf.config.sliding_window == WINDOW
    assert engine_greedy(folder, PROMPTS, backend) == transformers_greedy(hf, PROMPTS)


@pytest.mark.parametrize("backend", BACKENDS)
def test_window_is_applied(windowed: tuple, backend: str) -> None:
    """Without the window the same weights give other tokens once sequences pass it (and
    transformers' tokens for that model)."""
    folder, _ = windowed
    windowed_tokens = engine_greedy(folder, PROMPTS, backend)
    unwindowed = engine_greedy_with_window(folder, PROMPTS, backend, NO_WINDOW)
    assert windowed_tokens[1:] != unwindowed[1:]
    assert unwindowed == transformers_greedy(transformers_with_window(folder, NO_WINDOW), PROMPTS)


def test_window_through_prefix_cache_and_chunked_prefill(windowed: tuple) -> None:
    """Prefill chunks of 16 tokens cross the 8-token window; the second prompt extends the
    first, whose KV the radix cache serves."""
    folder, hf = windowed
    first = PROMPTS[2]
    prompts = [first, [*first, 7, 8, 9, *range(100, 130)]]
    tokens, cached = cached_chunked_greedy(folder, prompts, "intel_amx", chunk=16)
    assert cached[0] == 0 and cached[1] >= len(first) - 1
    assert tokens == transformers_greedy(hf, prompts)


@pytest.mark.skipif(not ops.using_cpp_kernels(), reason="the C++ kernels are not built")
def test_layers_keep_the_one_call_path(windowed: tuple) -> None:
    """The layers keep their one-call C++ form (it takes the batches the window cannot mask:
    the first prompt above, decode steps of short sequences)."""
    folder, _ = windowed
    assert all(fused_layers(folder))
    model = load_model(str(folder), dtype="float32").model
    assert {layer.self_attn.attn.sliding_window for layer in model.model.layers} == {WINDOW}


@pytest.mark.skipif(not ops.using_cpp_kernels(), reason="the C++ kernels are not built")
def test_fused_path_takes_only_batches_the_window_cannot_mask(
    windowed: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 3-token prompt with 4 new tokens never passes the window: its steps run the one-call
    layers; a longer prompt's do not. Both equal transformers."""
    folder, hf = windowed
    decisions: list[bool] = []
    original = fused_decoder._within_window

    def spy(forward_batch: object, window: int) -> bool:
        decisions.append(original(forward_batch, window))
        return decisions[-1]

    monkeypatch.setattr(fused_decoder, "_within_window", spy)
    short = [[2, 5, 9]]
    assert engine_greedy(folder, short, "intel_amx", new_tokens=4) == transformers_greedy(
        hf, short, new_tokens=4
    )
    assert decisions and all(decisions)
    decisions.clear()
    assert engine_greedy(folder, PROMPTS[2:], "intel_amx") == transformers_greedy(hf, PROMPTS[2:])
    assert decisions and not any(decisions)


@pytest.mark.parametrize("arch", ARCHS)
def test_window_as_long_as_the_context_masks_nothing(
    arch: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Phi-4-mini's window equals its context: no window, and no warning."""
    require_hf_arch(arch)
    with caplog.at_level(logging.WARNING):
        config = ModelConfig.from_hf_config(
            tiny_hf_config(arch, sliding_window=256, max_position_embeddings=256)
        )
    from radixserve.models.config import reference_sliding_window

    assert reference_sliding_window(config.hf_config, config.context_len) is None
    assert (
        reference_sliding_window(
            tiny_hf_config(arch, sliding_window=64, max_position_embeddings=256), 256
        )
        == 64
    )
    assert "sliding-window" not in caplog.text


@pytest.fixture(scope="module", params=("qwen2", "qwen3", "qwen2_moe"))
def qwen_windowed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple:
    """use_sliding_window with max_window_layers 1: Qwen2/Qwen3 window the layers from 1 on,
    Qwen2-MoE the even-numbered ones below it, layer 0 (transformers' layer_types)."""
    arch = request.param
    require_hf_arch(arch)
    folder = tmp_path_factory.mktemp(f"{arch}-window")
    hf = make_tiny_checkpoint(
        folder,
        arch,
        use_sliding_window=True,
        sliding_window=WINDOW,
        max_window_layers=1,
        max_position_embeddings=256,
    )
    return folder, hf


@pytest.mark.parametrize("backend", BACKENDS)
def test_qwen_per_layer_windows_equal_transformers(
    qwen_windowed: tuple, backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    folder, hf = qwen_windowed
    types = list(hf.config.layer_types)  # Qwen2-MoE marks them by its own rule
    assert set(types) == {"full_attention", "sliding_attention"}
    with caplog.at_level(logging.WARNING):
        model = load_model(str(folder), dtype="float32").model
    assert "sliding-window" not in caplog.text  # honoured now, not warned about
    windows = [layer.self_attn.attn.sliding_window for layer in model.model.layers]
    assert windows == [WINDOW if t == "sliding_attention" else None for t in types]
    assert engine_greedy(folder, PROMPTS, backend) == transformers_greedy(hf, PROMPTS)
    # The windows mask: the same weights attending fully give other tokens past the window.
    unwindowed = engine_greedy_with_window(folder, PROMPTS, backend, NO_WINDOW)
    assert unwindowed[1:] != engine_greedy(folder, PROMPTS, backend)[1:]
