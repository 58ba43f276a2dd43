"""A tiny SmolVLM served over HTTP: an OpenAI chat with an image_url part gives transformers'
greedy tokens, the folder's chat template writing the placeholder and the folder's processor
tiling the image; /v1/tokenize counts the tiled image's tokens as the processor does; an image
over --limit-mm-data-per-request is a 400."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from radixserve import Engine
from tests.helpers.tiny_idefics3 import hf_greedy, make_tiny_idefics3, png_bytes
from tests.helpers.tiny_llava import data_url

NEW = 6
MODEL = "tiny-smolvlm"
WIDE = (100, 30)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("smolvlm")
    return folder, make_tiny_idefics3(folder, "smolvlm")


@pytest.fixture(scope="module")
def engine(setup: tuple) -> Iterator[Engine]:
    folder, _ = setup
    with Engine(
        model_path=str(folder),
        runtime="thread",
        dtype="float32",
        skip_server_warmup=True,
        max_total_tokens=2048,
        attention_backend="torch_native",
        served_model_name=MODEL,
        limit_mm_data_per_request='{"image": 1}',
    ) as eng:
        yield eng


@pytest.fixture(scope="module")
def client(engine: Engine) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from radixserve.entrypoints.http_server import create_app

    with TestClient(create_app(engine, engine.server_args), raise_server_exceptions=False) as c:
        yield c


def _messages(images: list[str]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "w5 "}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in images]
    parts.append({"type": "text", "text": " w7 w8"})
    return [{"role": "user", "content": parts}]


# What the chat template renders for _messages with one image.
RENDERED = "user : w5  <image>  w7 w8 w3 w4 "


def test_chat_with_an_image_equals_transformers(setup: tuple, client: Any) -> None:
    folder, hf = setup
    image = png_bytes(30, WIDE)
    prompt, expected = hf_greedy(hf, folder, RENDERED, [image], NEW)
    r = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": _messages([data_url(image)]),
            "max_tokens": NEW,
            "temperature": 0,
            "ignore_eos": True,
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["prompt_tokens"] == len(prompt)
    from transformers import AutoTokenizer

    # The server skips special tokens (an image marker the tiny model may pick) as it decodes.
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = tokenizer.decode(expected, skip_special_tokens=True)
    assert body["choices"][0]["message"]["content"] == text


def test_tokenize_counts_the_tiled_image(setup: tuple, client: Any) -> None:
    folder, hf = setup
    image = png_bytes(31, WIDE)
    prompt, _ = hf_greedy(hf, folder, RENDERED, [image], 1)
    r = client.post("/v1/tokenize", json={"model": MODEL, "messages": _messages([data_url(image)])})
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == prompt


def test_too_many_images_is_a_400(client: Any) -> None:
    url = data_url(png_bytes(32, WIDE))
    r = client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": _messages([url, url]), "max_tokens": 2},
    )
    assert r.status_code == 400, r.text
    assert "at most 1" in r.json()["error"]["message"]
