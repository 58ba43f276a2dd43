"""--quantization w8a8_int8: Q8_0 blocks made from float weights dequantize back within half a
quantization step, and a quantized tiny model tracks its float self."""

from __future__ import annotations

import pytest
import torch

from radixserve.kernels import reference
from radixserve.models.int8_quant import apply_int8_quantization, q8_0_blocks
from tests.unit.test_kernels import _run_steps, _tiny_model


def test_q8_0_blocks_round_trip_within_half_a_step() -> None:
    torch.manual_seed(0)
    w = torch.randn(40, 96)
    w[3, :32] = 0.0  # an all-zero block: scale 0, no division by zero
    blocks = q8_0_blocks(w)
    assert blocks.shape == (40, 3 * 34) and blocks.dtype == torch.uint8
    back = reference.dequantize_blocks(blocks, reference.GGML_Q8_0, 40)
    step = w.reshape(40, 3, 32).abs().amax(-1, keepdim=True) / 127
    err = (back.reshape(40, 3, 32) - w.reshape(40, 3, 32)).abs()
    # Half a step from rounding q, plus up to 127 x the fp16 rounding of the scale (2^-11).
    assert bool((err <= step * (0.5 + 127 * 2**-11) + 1e-8).all())
    assert bool((back[3, :32] == 0).all())
    with pytest.raises(ValueError, match="multiple of 32"):
        q8_0_blocks(torch.randn(4, 40))


@pytest.mark.parametrize("cpp", [True, False], ids=["cpp", "pytorch-fallback"])
def test_quantized_tiny_model_tracks_float(cpp: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from radixserve.kernels import build, ops

    if cpp and build.load_extension() is None:
        pytest.skip("C++ kernels unavailable")
    if not cpp:
        monkeypatch.setattr(ops, "load_extension", lambda: None)
    model, config = _tiny_model("llama")
    with torch.inference_mode():
        want = _run_steps(model, config, fast=True)
        count, _ = apply_int8_quantization(model)
        got = _run_steps(model, config, fast=True)
    assert count == 4 * config.num_hidden_layers
    assert model.model.layers[0].mlp.down_proj.weight.numel() == 0  # the float copy is freed
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w, rtol=0.05, atol=0.05)
        assert (g.argmax(-1) == w.argmax(-1)).float().mean() >= 0.9
