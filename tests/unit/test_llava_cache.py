"""LLaVA's image tokens in the radix prefix cache: keyed by the image's content hash, so a repeated
image with a new question reuses its prefix (image included) while another image reuses only the
text before it; a cached prefix that ends inside an image runs the rest of the image's features;
answers stay transformers'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from radixserve import Engine
from tests.helpers.tiny_llava import (
    IMAGE_TOKEN,
    TOKENS_PER_IMAGE,
    data_url,
    hf_llava_greedy,
    make_tiny_llava,
    png_bytes,
)

NEW = 8
GREEDY = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
BEFORE = [1, 5, 6]  # text before the image


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("llava")
    return folder, make_tiny_llava(folder)


@pytest.fixture()
def engine(llava: tuple) -> Any:
    folder, _ = llava
    with Engine(
        model_path=str(folder),
        runtime="thread",
        dtype="float32",
        skip_tokenizer_init=True,
        skip_server_warmup=True,
        max_total_tokens=2048,
        attention_backend="torch_native",
    ) as eng:
        eng.scheduler.check_kv_each_step = True
        yield eng


def _run(engine: Engine, ids: list[int], image: bytes) -> tuple[list[int], int]:
    out = engine.generate(input_ids=ids, image_data=data_url(image), sampling_params=GREEDY)
    return out["output_ids"], out["meta_info"]["cached_tokens"]


def test_same_image_reuses_its_prefix_another_image_does_not(llava: tuple, engine: Any) -> None:
    folder, hf = llava
    first, second = png_bytes(10), png_bytes(11)
    question_a = [*BEFORE, IMAGE_TOKEN, 7, 8, 9]
    question_b = [*BEFORE, IMAGE_TOKEN, 20, 21]
    tokens, cached = _run(engine, question_a, first)
    assert cached == 0
    assert tokens == hf_llava_greedy(hf, folder, question_a, [first], NEW)
    # The same image, a new question: the text before it and all its tokens come from the cache.
    tokens, cached = _run(engine, question_b, first)
    assert cached == len(BEFORE) + TOKENS_PER_IMAGE
    assert tokens == hf_llava_greedy(hf, folder, question_b, [first], NEW)
    # Another image, whose placeholder token ids are the same: only the text before it.
    tokens, cached = _run(engine, question_b, second)
    assert cached == len(BEFORE)
    assert tokens == hf_llava_greedy(hf, folder, question_b, [second], NEW)


def test_cached_prefix_ending_inside_an_image(llava: tuple, engine: Any) -> None:
    """A prompt that ends with its image: a repeat matches all but its last token, so the
    step runs only the image's last feature."""
    folder, hf = llava
    image = png_bytes(12)
    ids = [*BEFORE, IMAGE_TOKEN]
    expected = hf_llava_greedy(hf, folder, ids, [image], NEW)
    assert _run(engine, ids, image) == (expected, 0)
    assert _run(engine, ids, image) == (expected, len(BEFORE) + TOKENS_PER_IMAGE - 1)
