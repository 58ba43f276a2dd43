"""--quantization w8a8_int8 and bitsandbytes: float weights quantized into GGUF blocks layer by
layer while a checkpoint loads (models/quantize_on_load.py, layers/quantization/on_load.py).

- Each block format reads back (kernels/gguf_dequant.py, gguf-py's arithmetic) within half of
  its quantization step of the float64 weight, and a matmul on the blocks stays within a
  bounded relative error of the float64 product.
- Loading never holds more than one decoder layer's projections in float.
- A quantized tiny model tracks its float self.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixserve.kernels import gguf_dequant, ops
from radixserve.kernels import gguf_types as gt
from radixserve.kernels.block_quantize import q4_1_blocks, q4_k_blocks, q8_0_blocks
from radixserve.layers.linear import LinearBase
from radixserve.layers.quantization import GGUFLinearMethod
from radixserve.layers.quantization.on_load import QuantizeOnLoadMethod
from radixserve.models import quantize_on_load
from radixserve.models.loader import load_model
from radixserve.models.quantize_on_load import SCHEMES, OnLoadQuantization
from tests.helpers.tiny_models import make_tiny_checkpoint
from tests.unit.test_kernels import _run_steps, _tiny_model

PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def _weights(rows: int, cols: int) -> torch.Tensor:
    torch.manual_seed(0)
    w = torch.randn(rows, cols) * 0.05
    w[1] += 0.3  # a row entirely above zero: its minimum is not negative
    w[3, :32] = 0.0  # an all-zero block: scale 0, no division by zero
    w[5, 64:96] *= 40  # an outlier block
    return w


def _back(blocks: torch.Tensor, qtype: int, rows: int) -> torch.Tensor:
    return gguf_dequant.dequantize_rows(blocks, qtype, rows).double()


def test_q8_0_blocks_round_trip_within_half_a_step() -> None:
    w = _weights(40, 96)
    blocks = q8_0_blocks(w)
    assert blocks.shape == (40, 3 * 34) and blocks.dtype == torch.uint8
    back = _back(blocks, gt.Q8_0, 40)
    step = w.double().reshape(40, 3, 32).abs().amax(-1, keepdim=True) / 127
    err = (back - w.double()).reshape(40, 3, 32).abs()
    # Half a step from rounding q, plus up to 127 x the fp16 rounding of the scale (2^-11).
    assert bool((err <= step * (0.5 + 127 * 2**-11) + 1e-12).all())
    assert bool((back[3, :32] == 0).all())
    with pytest.raises(ValueError, match="multiple of 32"):
        q8_0_blocks(torch.randn(4, 40))


def test_q4_1_blocks_round_trip_within_half_a_step() -> None:
    w = _weights(40, 96)
    blocks = q4_1_blocks(w)
    assert blocks.shape == (40, 3 * 20)
    back = _back(blocks, gt.Q4_1, 40).reshape(40, 3, 32)
    w64 = w.double().reshape(40, 3, 32)
    low, high = w64.amin(-1, keepdim=True), w64.amax(-1, keepdim=True)
    step = (high - low) / 15
    # Half a step, plus the fp16 roundings of the minimum and of the step (2^-11 relative;
    # the step is rounded up, so at most 15 steps of 2^-10 at the top of the range).
    slack = low.abs() * 2**-11 + 15 * step * 2**-10
    assert bool(((back - w64).abs() <= step / 2 + slack + 1e-12).all())
    assert bool((back[3, 0] == 0).all())


def test_q4_k_blocks_round_trip_within_half_a_sub_block_step() -> None:
    w = _weights(24, 512)
    blocks = q4_k_blocks(w)
    assert blocks.shape == (24, 2 * 144)
    back = _back(blocks, gt.Q4_K, 24).reshape(24, 2, 8, 32)
    w64 = w.double().reshape(24, 2, 8, 32)
    # A sub-block's codes cover [min(w, 0), max(w)] (its 6-bit min and scale rounded up): the
    # step is at most that range over 15, plus one unit of the super-block's min and scale
    # quanta (their maximum over 63, rounded up to fp16).
    offset = (-w64.amin(-1)).clamp(min=0)
    dmin = offset.amax(-1, keepdim=True) / 63 * (1 + 2**-10)
    needed = (w64.amax(-1) + offset + dmin) / 15
    d = needed.amax(-1, keepdim=True) / 63 * (1 + 2**-10)
    step = needed + d
    err = (back - w64).abs().amax(-1)
    assert bool((err <= step / 2 * (1 + 1e-6)).all())
    with pytest.raises(ValueError, match="multiple of 256"):
        q4_k_blocks(torch.randn(4, 96))


@pytest.mark.parametrize(
    ("quantize", "qtype", "bound"),
    [(q8_0_blocks, gt.Q8_0, 0.01), (q4_1_blocks, gt.Q4_1, 0.1), (q4_k_blocks, gt.Q4_K, 0.1)],
    ids=["Q8_0", "Q4_1", "Q4_K"],
)
def test_matmul_on_the_blocks_stays_near_float64(
    quantize: object, qtype: int, bound: float
) -> None:
    """gguf_linear on the made blocks (the C++ kernels where built: int16 or int8 activations)
    against the float64 product with the float weight: the relative error of the output is that
    of the 4-/8-bit weights (measured ~0.063 for 4 bits, ~0.005 for 8), under `bound`."""
    torch.manual_seed(1)
    w = torch.randn(256, 512) * 0.05
    x = torch.randn(5, 512)
    blocks = quantize(w)
    got = ops.gguf_linear(x, blocks, qtype, 256).double()
    want = x.double() @ w.double().T
    assert (got - want).norm().item() <= bound * want.norm().item()


@pytest.mark.parametrize("scheme", ["w8a8_int8", "bitsandbytes"])
@pytest.mark.parametrize("cpp", [True, False], ids=["cpp", "pytorch-fallback"])
def test_quantized_tiny_model_tracks_float(
    scheme: str, cpp: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from radixserve.kernels import build

    if cpp and build.load_extension() is None:
        pytest.skip("C++ kernels unavailable")
    if not cpp:
        monkeypatch.setattr(ops, "load_extension", lambda: None)
    model, config = _tiny_model("llama")
    with torch.inference_mode():
        want = _run_steps(model, config, fast=True)
        count, _ = OnLoadQuantization(model, SCHEMES[scheme]).quantize_loaded()
        got = _run_steps(model, config, fast=True)
    assert count == 4 * config.num_hidden_layers
    down = model.model.layers[0].mlp.down_proj
    assert down.weight.numel() == 0  # the float copy is freed
    assert isinstance(down.quant_method, GGUFLinearMethod)
    tolerance, agreement = (0.05, 0.9) if scheme == "w8a8_int8" else (0.5, 0.6)
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w, rtol=tolerance, atol=tolerance)
        assert (g.argmax(-1) == w.argmax(-1)).float().mean() >= agreement


def _float_projection_bytes(model: torch.nn.Module) -> int:
    return sum(
        m.weight.numel() * m.weight.element_size()
        for name, m in model.named_modules()
        if name.endswith(PROJECTIONS) and isinstance(m, LinearBase)
    )


def _layer_projection_bytes(model: torch.nn.Module) -> int:
    """Float bytes of one decoder layer's projections (all layers are alike here)."""
    layer = model.model.layers[0]
    return sum(
        m.output_size * m.input_size * 4
        for name, m in layer.named_modules()
        if name.endswith(PROJECTIONS) and isinstance(m, LinearBase)
    )


@pytest.mark.parametrize("scheme", ["w8a8_int8", "bitsandbytes"])
def test_loading_holds_at_most_one_layer_in_float(
    scheme: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every checkpoint tensor handed to the model is followed by a count of the float bytes
    the projections hold: never more than one decoder layer's (the q, k and v of a layer arrive
    apart, so a fused layer waits for its last shard), and nothing once loaded. The blocks equal
    those made from the fully loaded float model."""
    path = tmp_path / "tiny"
    make_tiny_checkpoint(path, intermediate_size=256, num_hidden_layers=3)
    seen: list[int] = []
    model_box: list[torch.nn.Module] = []
    real_install = OnLoadQuantization.install

    def install(self: OnLoadQuantization) -> int:
        model_box.append(self.model)
        count = real_install(self)
        assert _float_projection_bytes(self.model) == 0  # the built weights' storage dropped
        return count

    def watched(files: object, progress: bool = True):  # type: ignore[no-untyped-def]
        for item in real_iterate(files, progress):
            yield item
            seen.append(_float_projection_bytes(model_box[0]))

    from radixserve.models import loader

    real_iterate = loader.iterate_weights
    monkeypatch.setattr(OnLoadQuantization, "install", install)
    monkeypatch.setattr(loader, "iterate_weights", watched)
    loaded = load_model(str(path), dtype="float32", quantization=scheme)
    model = loaded.model
    limit = _layer_projection_bytes(model)
    assert seen and max(seen) <= limit
    assert max(seen) > 0  # the hook did watch float weights come and go
    assert _float_projection_bytes(model) == 0
    monkeypatch.undo()
    reference = load_model(str(path), dtype="float32").model
    OnLoadQuantization(reference, SCHEMES[scheme]).quantize_loaded()
    for (name, got), (_, want) in zip(
        model.named_modules(), reference.named_modules(), strict=True
    ):
        if name.endswith(PROJECTIONS):
            g, w = got.quant_method.gguf_weight(), want.quant_method.gguf_weight()
            assert g.qtype == w.qtype and torch.equal(g.blocks, w.blocks), name
    types = {
        m.quant_method.gguf_weight().qtype
        for n, m in model.named_modules()
        if n.endswith(PROJECTIONS)
    }
    assert types == ({gt.Q8_0} if scheme == "w8a8_int8" else {gt.Q4_1, gt.Q4_K})


def test_a_missing_shard_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tiny"
    make_tiny_checkpoint(path)
    from radixserve.models import loader

    real_iterate = loader.iterate_weights

    def without_v(files: object, progress: bool = True):  # type: ignore[no-untyped-def]
        return (
            (n, t) for n, t in real_iterate(files, progress) if "layers.1.self_attn.v_proj" not in n
        )

    monkeypatch.setattr(loader, "iterate_weights", without_v)
    with pytest.raises(ValueError, match=r"missing tensors: model\.layers\.1\.self_attn\.v_proj"):
        load_model(str(path), dtype="float32", quantization="w8a8_int8")


def test_a_layer_still_loading_refuses_to_run() -> None:
    model, _ = _tiny_model("llama")
    OnLoadQuantization(model, SCHEMES["w8a8_int8"]).install()
    layer = model.model.layers[0].mlp.down_proj
    assert isinstance(layer.quant_method, QuantizeOnLoadMethod)
    with pytest.raises(RuntimeError, match="still loading"):
        layer(torch.randn(1, layer.input_size))
    with pytest.raises(ValueError, match="never completely loaded"):
        layer.quant_method.process_weights_after_loading(layer)
    assert quantize_on_load.SCHEMES["bitsandbytes"].takes(64)


@pytest.mark.parametrize("quantize", [q8_0_blocks, q4_1_blocks, q4_k_blocks])
def test_row_chunks_make_the_same_bytes(quantize: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from radixserve.kernels import block_quantize

    w = _weights(37, 512)
    whole = quantize(w)
    monkeypatch.setattr(block_quantize, "CHUNK_WEIGHTS", 5 * 512)  # 5 rows a chunk, 2 left
    assert torch.equal(block_quantize.in_row_chunks(quantize, w), whole)
