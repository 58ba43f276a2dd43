"""A tiny LLaVA-OneVision served over HTTP: an OpenAI chat with a data-URL image_url part gives
transformers' greedy tokens, the folder's chat template writing the placeholder and the
folder's processor choosing the image's crops; /v1/tokenize counts the image's tokens as the
processor does; a video part is a 400 naming it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from radixserve import Engine
from tests.helpers.tiny_llava import data_url
from tests.helpers.tiny_llava_onevision import hf_greedy, make_tiny, png_bytes

NEW = 6
MODEL = "tiny-onevision"
TALL = (30, 70)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("onevision")
    return folder, make_tiny(folder, "onevision", seed=5)


@pytest.fixture(scope="module")
def client(setup: tuple) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from radixserve.entrypoints.http_server import create_app

    folder, _ = setup
    engine = Engine(
        model_path=str(folder),
        runtime="thread",
        dtype="float32",
        skip_server_warmup=True,
        max_total_tokens=2048,
        attention_backend="torch_native",
        served_model_name=MODEL,
    )
    app = create_app(engine, engine.server_args)
    with engine, TestClient(app, raise_server_exceptions=False) as c:
        yield c


def _messages(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    content = [{"type": "text", "text": "w5 "}, *parts, {"type": "text", "text": " w7 w8"}]
    return [{"role": "user", "content": content}]


def _image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


# What the chat template renders for _messages with one image.
RENDERED = "user : w5  <image>  w7 w8 w3 w4 "


def test_chat_with_an_image_equals_transformers(setup: tuple, client: Any) -> None:
    from transformers import AutoTokenizer

    folder, hf = setup
    image = png_bytes(30, TALL)
    prompt, expected = hf_greedy(hf, folder, "onevision", RENDERED, [image], NEW)
    r = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": _messages([_image(data_url(image))]),
            "max_tokens": NEW,
            "temperature": 0,
            "ignore_eos": True,
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["prompt_tokens"] == len(prompt)
    # The server skips special tokens (the image token the tiny model may pick) as it decodes.
    text = AutoTokenizer.from_pretrained(folder).decode(expected, skip_special_tokens=True)
    assert body["choices"][0]["message"]["content"] == text


def test_tokenize_counts_the_images_crops(setup: tuple, client: Any) -> None:
    folder, hf = setup
    for size in (TALL, (90, 40)):
        image = png_bytes(31, size)
        prompt, _ = hf_greedy(hf, folder, "onevision", RENDERED, [image], 1)
        r = client.post(
            "/v1/tokenize",
            json={"model": MODEL, "messages": _messages([_image(data_url(image))])},
        )
        assert r.status_code == 200, r.text
        assert r.json()["tokens"] == prompt


def test_a_video_part_is_a_400(client: Any) -> None:
    part = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}
    r = client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": _messages([part]), "max_tokens": 2},
    )
    assert r.status_code == 400, r.text
    assert "'video_url' are not supported" in r.json()["error"]["message"]
