"""A tiny LLaVA under the process runtime (scheduler and detokenizer in their own processes, the
API side's light tokenizer), under --tp-size 2 (the step's image pieces travel to rank 1 with
the step) and under --dp-size 2 (each replica gets its requests' images): text prompts with
images give transformers' greedy tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from radixserve import Engine
from tests.helpers.tiny_llava import (
    IMAGE_TOKEN,
    data_url,
    hf_llava_greedy,
    make_tiny_llava,
    png_bytes,
)

NEW = 8
GREEDY = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("llava")
    return folder, make_tiny_llava(folder)


@pytest.mark.parametrize(
    "parallel", [{"tp_size": 1}, {"tp_size": 2}, {"dp_size": 2}], ids=["tp1", "tp2", "dp2"]
)
def test_process_runtime_with_images(llava: tuple, parallel: dict[str, int]) -> None:
    folder, hf = llava
    images = [png_bytes(30), png_bytes(31)]
    expected = [
        hf_llava_greedy(hf, folder, [5, IMAGE_TOKEN, 6], [images[0]], NEW),
        hf_llava_greedy(hf, folder, [5, IMAGE_TOKEN, 7, IMAGE_TOKEN, 6], images, NEW),
    ]
    with Engine(
        model_path=str(folder),
        dtype="float32",
        skip_server_warmup=True,
        max_total_tokens=2048,
        attention_backend="torch_native",
        **parallel,
    ) as engine:
        outs = engine.generate(
            prompt=["w5 <image> w6", "w5 <image> w7 <image> w6"],
            image_data=[data_url(images[0]), [data_url(b) for b in images]],
            sampling_params=GREEDY,
        )
        assert [o["output_ids"] for o in outs] == expected
        # Again: now the images' prefixes come from the radix cache.
        again = engine.generate(
            prompt="w5 <image> w6", image_data=data_url(images[0]), sampling_params=GREEDY
        )
        assert again["output_ids"] == expected[0]
        assert again["meta_info"]["cached_tokens"] > 0
