"""Linear weights pre-packed for oneDNN (kernels/onednn_linear.py, layers/fast_path.py).

The engine packs bfloat16 weights, which oneDNN only accepts on CPUs with AVX512BW/VL/DQ or
AVX-NE-CONVERT; the bfloat16 tests skip elsewhere (saying why). oneDNN packs float32 on any x86
CPU, so the plumbing (which layers get packed weights, that they then run module by module and
compute what the plain weights do, that switching the fast path off unpacks) is tested here on
float32 by pointing fast_path.ONEDNN_PACKED_DTYPE at it.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from radixserve.kernels.onednn_linear import onednn_linear, pack_weight, packing_support
from radixserve.layers import fast_path
from radixserve.layers.fast_path import use_fast_kernels
from radixserve.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from radixserve.layers.quantization import packed as packed_module
from radixserve.layers.quantization.packed import OneDNNLinearMethod
from radixserve.models.llama import LlamaDecoderLayer
from tests.unit.test_kernels import _run_steps, _tiny_model


def _packed(module: torch.nn.Module) -> bool:
    return isinstance(getattr(module, "quant_method", None), OneDNNLinearMethod)


LINEARS = (ReplicatedLinear, ColumnParallelLinear, RowParallelLinear)


def _require_packing(dtype: torch.dtype) -> None:
    supported, why_not = packing_support(dtype)
    if not supported:
        pytest.skip(f"oneDNN cannot pack {dtype} on this CPU: {why_not}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_packed_linear_matches_plain(dtype: torch.dtype, rows: int) -> None:
    _require_packing(dtype)
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(96, 64, generator=gen) / 8).to(dtype)
    bias = torch.randn(96, generator=gen).to(dtype)
    x = torch.randn(2, rows, 64, generator=gen).to(dtype)  # leading dims are kept
    packed = pack_weight(w)
    got = onednn_linear(x, packed, bias)
    assert got.shape == (2, rows, 96) and got.dtype == dtype
    want = x.double() @ w.double().T + bias.double()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    assert torch.equal(w, w.clone()), "packing must copy, never change the plain weight"


def test_packing_refuses_what_it_cannot_pack() -> None:
    with pytest.raises(ValueError, match="2-D"):
        pack_weight(torch.ones(4))


def test_bfloat16_support_verdict_is_explained() -> None:
    supported, why_not = packing_support(torch.bfloat16)
    assert supported or why_not, "a refusal must say why"


def _plain_steps(model: torch.nn.Module, config: object, monkeypatch: pytest.MonkeyPatch) -> list:
    """The fast path module by module on the plain weights (no weight of the model is
    float16, so nothing is packed)."""
    with monkeypatch.context() as patch:
        patch.setattr(fast_path, "ONEDNN_PACKED_DTYPE", torch.float16)
        return _run_steps(model, config, fast=True, fused=False)


def test_packed_model_runs_module_by_module_and_matches_plain(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _require_packing(torch.float32)
    model, config = _tiny_model("llama")
    with torch.inference_mode():
        want = _plain_steps(model, config, monkeypatch)
        monkeypatch.setattr(fast_path, "ONEDNN_PACKED_DTYPE", torch.float32)
        with caplog.at_level(logging.INFO, logger=fast_path.__name__):
            use_fast_kernels(model, True)
        linears = [m for m in model.modules() if isinstance(m, LINEARS)]
        assert all(_packed(m) for m in linears)
        assert _packed(model.lm_head)
        assert f"pre-packed for oneDNN: {len(linears) + 1} layers" in caplog.text
        layers = [m for m in model.modules() if isinstance(m, LlamaDecoderLayer)]
        assert layers and all(layer.fused_args is None for layer in layers)
        calls: list[int] = []

        def counted(x: torch.Tensor, weight: object, bias: torch.Tensor | None) -> torch.Tensor:
            calls.append(1)
            return onednn_linear(x, weight, bias)

        monkeypatch.setattr(packed_module, "onednn_linear", counted)
        got = _run_steps(model, config, fast=True)  # packs again, runs, switches off
    # every projection of every layer and the LM head, in each of the three steps
    assert len(calls) == 3 * (len(linears) + 1)
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
        assert torch.equal(g.argmax(-1), w.argmax(-1))
    # _run_steps ends with use_fast_kernels(model, False): back to plain weights
    assert not any(_packed(m) for m in model.modules())


def test_packed_weights_follow_the_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not with the fast path off (the reference ops), nor with repack_weights=False (what
    --enable-torch-compile passes), and only for weights of the packed dtype."""
    _require_packing(torch.float32)
    monkeypatch.setattr(fast_path, "ONEDNN_PACKED_DTYPE", torch.float32)
    model, _ = _tiny_model("llama")
    use_fast_kernels(model, True, repack_weights=False)
    assert not any(_packed(m) for m in model.modules())
    assert all(m.fused_args is not None for m in model.modules() if hasattr(m, "fused_args"))
    use_fast_kernels(model, True)
    assert any(_packed(m) for m in model.modules())
    use_fast_kernels(model, False)
    assert not any(_packed(m) for m in model.modules())
    bf16_model, _ = _tiny_model("llama", torch.bfloat16)
    assert fast_path.pack_for_onednn(bf16_model, LINEARS, enabled=True) == 0


def test_bfloat16_model_packs_where_the_cpu_can(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The engine's own choice for a bfloat16 model: packed weights where oneDNN takes
    bfloat16, else the plain path with the reason logged; either way the same logits as the
    plain weights up to bfloat16 rounding."""
    model, config = _tiny_model("llama", torch.bfloat16)
    with torch.inference_mode():
        want = _plain_steps(model, config, monkeypatch)
        with caplog.at_level(logging.INFO, logger=fast_path.__name__):
            packed = fast_path.pack_for_onednn(model, LINEARS, enabled=True)
        supported, why_not = packing_support(torch.bfloat16)
        if supported:
            assert packed > 0 and "pre-packed for oneDNN" in caplog.text
        else:
            assert packed == 0 and why_not in caplog.text
        got = _run_steps(model, config, fast=True)
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w, rtol=5e-2, atol=5e-2)
        assert torch.equal(g.argmax(-1), w.argmax(-1))


def test_packed_bias_free_output_equals_f_linear_float32() -> None:
    _require_packing(torch.float32)
    w, x = torch.randn(32, 16), torch.randn(3, 16)
    torch.testing.assert_close(onednn_linear(x, pack_weight(w), None), F.linear(x, w))
