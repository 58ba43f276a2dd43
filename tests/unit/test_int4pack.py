"""GGUF Q4_1 layers on PyTorch's packed int4 matmul (kernels/int4pack.py, layers/fast_path.py).

PyTorch runs this matmul on any x86 CPU (bfloat16 emulated without BF16 units), so the mapping
of the blocks, the choice and the module-by-module run are all checked here; only its speed on
AVX512-BF16/AMX machines is not (there `auto` times it against our kernels at startup).
"""

from __future__ import annotations

import logging

import pytest
import torch

from radixserve.kernels import reference
from radixserve.kernels.int4pack import (
    int4pack_linear,
    int4pack_support,
    pack_q4_1,
)
from radixserve.layers import fast_path
from radixserve.layers.fast_path import INT4_ENV, use_fast_kernels
from radixserve.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from radixserve.layers.quantization import GGUFWeight
from radixserve.layers.quantization import packed as packed_module
from radixserve.layers.quantization.packed import Int4PackLinearMethod
from radixserve.models.llama import LlamaDecoderLayer
from tests.unit.test_kernels import _quantize_tiny, _random_gguf_blocks, _run_steps, _tiny_model

LINEARS = (ReplicatedLinear, ColumnParallelLinear, RowParallelLinear)
Q4_1 = reference.GGML_Q4_1


@pytest.fixture(autouse=True)
def _needs_int4pack() -> None:
    supported, why_not = int4pack_support()
    if not supported:
        pytest.skip(f"PyTorch's int4 matmul does not run here: {why_not}")


def _blocks(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    return _random_gguf_blocks(rows, cols, Q4_1, torch.Generator().manual_seed(seed))


def test_codes_are_the_blocks_dequantization() -> None:
    blocks = _blocks(32, 96)
    q, d, m = reference.q4_1_codes(blocks)
    assert q.shape == (32, 3, 32) and int(q.min()) >= 0 and int(q.max()) <= 15
    assert d.shape == m.shape == (32, 3, 1)
    dense = reference.dequantize_blocks(blocks, Q4_1, 32)
    assert torch.equal((d * q.float() + m).reshape(32, 96), dense)
    # the first block's first and 17th weights: low and high nibble of its first byte
    byte, scale, offset = int(blocks[0, 4]), d[0, 0, 0], m[0, 0, 0]
    assert torch.equal(dense[0, 0], scale * (byte & 15) + offset)
    assert torch.equal(dense[0, 16], scale * (byte >> 4) + offset)


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_int4pack_linear_matches_the_dequantized_weight(rows: int) -> None:
    blocks = _blocks(48, 128, seed=rows)
    weight = pack_q4_1(blocks)
    assert (weight.out_features, weight.in_features) == (48, 128)
    dense = reference.dequantize_blocks(blocks, Q4_1, 48)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, rows, 128, generator=gen)
    bias = torch.randn(48, generator=gen)
    got = int4pack_linear(x, weight, bias)
    assert got.shape == (2, rows, 48) and got.dtype == torch.float32
    want = x.double() @ dense.double().T + bias.double()
    # bfloat16 activations and scales: ~3 significant digits
    err = (got.double() - want).norm() / want.norm()
    assert err < 1e-2, f"relative error {err:.3g}"


def test_pack_refuses_shapes_it_cannot_take() -> None:
    with pytest.raises(ValueError, match="multiple of 16 rows"):
        pack_q4_1(_blocks(8, 64))
    with pytest.raises(ValueError, match="uint8"):
        pack_q4_1(torch.zeros(16, 40, dtype=torch.int32))


def _q4_1_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [
        m for m in model.modules() if _held_blocks(m) is not None and _held_blocks(m).qtype == Q4_1
    ]


def _held_blocks(module: torch.nn.Module) -> GGUFWeight | None:
    method = getattr(module, "quant_method", None)
    return None if method is None else method.gguf_weight()


def _on_int4(module: torch.nn.Module) -> bool:
    return isinstance(getattr(module, "quant_method", None), Int4PackLinearMethod)


def test_forced_int4_runs_module_by_module_and_tracks_our_kernels(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    model, config = _tiny_model("llama")
    _quantize_tiny(model)
    with torch.inference_mode():
        monkeypatch.setenv(INT4_ENV, "0")
        want = _run_steps(model, config, fast=True, fused=False)
        monkeypatch.setenv(INT4_ENV, "1")
        with caplog.at_level(logging.INFO, logger=fast_path.__name__):
            use_fast_kernels(model, True)
        q4 = _q4_1_layers(model)
        assert q4 and all(_on_int4(m) for m in q4)
        assert f"packed int4 matmul, bfloat16 activations: {len(q4)} layers" in caplog.text
        assert all(
            m.fused_args is None for m in model.modules() if isinstance(m, LlamaDecoderLayer)
        )
        calls: list[int] = []

        def counted(x: torch.Tensor, weight: object, bias: object = None) -> torch.Tensor:
            calls.append(1)
            return int4pack_linear(x, weight, bias)

        monkeypatch.setattr(packed_module, "int4pack_linear", counted)
        got = _run_steps(model, config, fast=True)
    assert len(calls) == 3 * len(q4)  # every Q4_1 layer in each of the three steps
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w, rtol=5e-2, atol=5e-2)
        assert torch.equal(g.argmax(-1), w.argmax(-1))
    assert not any(_on_int4(m) for m in model.modules())  # switched off


def test_auto_takes_int4_only_with_bf16_units_and_a_measured_gain(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from radixserve.kernels.cpu_features import CpuFeatures

    model, _ = _tiny_model("llama")
    _quantize_tiny(model)
    monkeypatch.delenv(INT4_ENV, raising=False)
    plain = CpuFeatures("test CPU", frozenset({"avx2"}))
    amx = CpuFeatures("test CPU", frozenset({"avx2", "amx_bf16"}))
    monkeypatch.setattr(fast_path, "cpu_features", lambda: plain)
    with caplog.at_level(logging.INFO, logger=fast_path.__name__):
        assert fast_path.pack_q4_1_for_int4(model, LINEARS, enabled=True) == 0
    assert "no AVX512-BF16/AMX-BF16" in caplog.text
    monkeypatch.setattr(fast_path, "cpu_features", lambda: amx)
    # Timed every call here (no figures remembered across calls: test_remembered_timing.py).
    monkeypatch.setattr(
        fast_path, "remembered_figures", lambda kind, ext, inputs, measure: (measure(), "measured")
    )
    monkeypatch.setattr(fast_path, "_int4_gain", lambda layer: 1.02)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=fast_path.__name__):
        assert fast_path.pack_q4_1_for_int4(model, LINEARS, enabled=True) == 0
    assert "measured 1.02x" in caplog.text
    monkeypatch.setattr(fast_path, "_int4_gain", lambda layer: 2.5)
    # Layers that would run as one C++ call keep it, whatever one matmul measures.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=fast_path.__name__):
        assert fast_path.pack_q4_1_for_int4(model, LINEARS, True, keeps_one_call=True) == 0
    assert "would give up" in caplog.text
    assert fast_path.pack_q4_1_for_int4(model, LINEARS, enabled=True) == len(_q4_1_layers(model))
    assert fast_path.pack_q4_1_for_int4(model, LINEARS, enabled=False) == 0
    assert not any(_on_int4(m) for m in model.modules())


def test_the_gain_probe_times_both_kernels_on_the_layer() -> None:
    model, _ = _tiny_model("llama")
    _quantize_tiny(model)
    gain = fast_path._int4_gain(_held_blocks(_q4_1_layers(model)[0]), rounds=2)
    assert 0 < gain < float("inf")
