"""A tiny SmolVLM under the process runtime (the tiled pixels pickled to the scheduler process
with the request) and under --tp-size 2 (each rank runs the replicated vision side on the
step's image pieces): text prompts with images give transformers' greedy tokens, and a repeat
reuses the cached image span."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from radixserve import Engine
from tests.helpers.tiny_idefics3 import hf_greedy, make_tiny_idefics3, png_bytes
from tests.helpers.tiny_llava import data_url

NEW = 8
GREEDY = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def smolvlm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("smolvlm")
    return folder, make_tiny_idefics3(folder, "smolvlm")


@pytest.mark.parametrize("tp_size", [1, 2])
def test_process_runtime_with_tiled_images(smolvlm: tuple, tp_size: int) -> None:
    folder, hf = smolvlm
    images = [png_bytes(40, (100, 30)), png_bytes(41, (40, 32))]
    prompts = ["w5 <image> w6", "w5 <image> w7 <image> w6"]
    expected = [
        hf_greedy(hf, folder, prompts[0], images[:1], NEW),
        hf_greedy(hf, folder, prompts[1], images, NEW),
    ]
    with Engine(
        model_path=str(folder),
        dtype="float32",
        skip_server_warmup=True,
        max_total_tokens=2048,
        attention_backend="torch_native",
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
