"""A tiny Qwen2-VL under the process runtime (patches and grid pickled to the scheduler process
with the request) and under --tp-size 2 (each rank runs the replicated vision transformer, the
step's M-RoPE positions broadcast with it): text prompts with images give transformers' greedy
tokens, and a repeat reuses the cached image span."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from radixserve import Engine
from tests.helpers.tiny_llava import data_url
from tests.helpers.tiny_qwen2vl import hf_greedy, make_tiny_qwen2vl, png_bytes

NEW = 8
GREEDY = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
IMG = "<|vision_start|><|image_pad|><|vision_end|>"


@pytest.fixture(scope="module")
def qwen2vl(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("qwen2vl")
    return folder, make_tiny_qwen2vl(folder, "qwen2_vl", seed=7)


@pytest.mark.parametrize("tp_size", [1, 2])
def test_process_runtime_with_grid_images(qwen2vl: tuple, tp_size: int) -> None:
    folder, hf = qwen2vl
    images = [png_bytes(40, (48, 30)), png_bytes(41, (24, 56))]
    prompts = [f"w5 {IMG} w6", f"w5 {IMG} w7 {IMG} w6"]
    expected = [
        hf_greedy(hf, folder, prompts[0], images[:1], NEW),
        hf_greedy(hf, folder, prompts[1], images, NEW),
    ]
    with Engine(
        model_path=str(folder),
        dtype="float32",
        skip_server_warmup=True,
        max_total_tokens=2048,
        tp_size=tp_size,
    ) as engine:
        outs = engine.generate(
            prompt=prompts,
            image_data=[data_url(images[0]), [data_url(b) for b in images]],
            sampling_params=GREEDY,
        )
        assert [o["output_ids"] for o in outs] == [tokens for _, tokens in expected]
        assert [o["meta_info"]["prompt_tokens"] for o in outs] == [len(p) for p, _ in expected]
        again = engine.generate(
            prompt=prompts[0], image_data=data_url(images[0]), sampling_params=GREEDY
        )
        assert again["output_ids"] == expected[0][1]
        assert again["meta_info"]["cached_tokens"] == len(expected[0][0]) - 1
