"""A vision model's encoder switches to the language model's float matmul (ops.float_linear)
with the fast kernels and back without them; the features stay those of nn.Linear up to the
summation order, and greedy output with images still equals transformers'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from radixserve import Engine
from radixserve.kernels.build import load_extension
from radixserve.layers.vision_linears import FastFloatLinear, use_fast_vision_linears
from tests.helpers.tiny_llava import (
    IMAGE_TOKEN,
    data_url,
    hf_llava_greedy,
    make_tiny_llava,
    png_bytes,
)


class _Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.vision = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8, bias=False))
        self.lm_gate = nn.Linear(8, 4)  # not the vision side: never switched


def test_switch_and_back_keeps_the_outputs() -> None:
    torch.manual_seed(0)
    toy = _Toy()
    x = torch.randn(5, 16)
    before = toy.vision(x)
    assert use_fast_vision_linears(toy, True) == 2
    assert all(type(m) is FastFloatLinear for m in (toy.vision[0], toy.vision[2]))
    assert type(toy.lm_gate) is nn.Linear
    assert torch.allclose(toy.vision(x), before, atol=1e-5)
    assert use_fast_vision_linears(toy, False) == 2
    assert type(toy.vision[0]) is nn.Linear
    assert torch.equal(toy.vision(x), before)


@pytest.mark.skipif(load_extension() is None, reason="needs the C++ kernels")
def test_llava_on_the_fast_kernels_equals_transformers(tmp_path: Path) -> None:
    hf: Any = make_tiny_llava(tmp_path)
    image = png_bytes(40)
    new = 8
    expected = hf_llava_greedy(hf, tmp_path, [5, IMAGE_TOKEN, 6], [image], new)
    with Engine(
        model_path=str(tmp_path),
        dtype="float32",
        skip_server_warmup=True,
        max_total_tokens=1024,
        runtime="thread",
    ) as engine:
        model = engine.scheduler.runner.model
        assert any(type(m) is FastFloatLinear for m in model.vision.modules())
        out = engine.generate(
            prompt="w5 <image> w6",
            image_data=data_url(image),
            sampling_params={"max_new_tokens": new, "temperature": 0, "ignore_eos": True},
        )
    assert out["output_ids"] == expected
