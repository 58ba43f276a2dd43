"""A tiny Qwen2-VL served over HTTP: an OpenAI chat with a data-URL image_url part gives
transformers' greedy tokens (the folder's chat template writes the image's pad token, the
folder's image processor sizes it); /v1/tokenize counts the image's tokens as the processor
does; a video part is a 400."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from radixserve import Engine
from tests.helpers.tiny_llava import data_url
from tests.helpers.tiny_qwen2vl import IMAGE_PAD, hf_greedy, make_tiny_qwen2vl, png_bytes

NEW = 6
MODEL = "tiny-qwen2-vl"
SIZE = (48, 30)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("qwen2vl")
    return folder, make_tiny_qwen2vl(folder, "qwen2_vl", seed=5)


@pytest.fixture(scope="module")
def client(setup: tuple) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from radixserve.entrypoints.http_server import create_app

    folder, _ = setup
    with (
        Engine(
            model_path=str(folder),
            runtime="thread",
            dtype="float32",
            skip_server_warmup=True,
            max_total_tokens=2048,
            served_model_name=MODEL,
        ) as engine,
        TestClient(create_app(engine, engine.server_args), raise_server_exceptions=False) as c,
    ):
        yield c


def _messages(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    content = [{"type": "text", "text": "w5 "}, *parts, {"type": "text", "text": " w7 w8"}]
    return [{"role": "user", "content": content}]


def _image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


# What the chat template renders for _messages with one image.
RENDERED = "user : w5  <|vision_start|><|image_pad|><|vision_end|>  w7 w8 w3 w4 "


def test_chat_with_an_image_equals_transformers(setup: tuple, client: Any) -> None:
    folder, hf = setup
    image = png_bytes(30, SIZE)
    prompt, expected = hf_greedy(hf, folder, RENDERED, [image], NEW)
    assert prompt.count(IMAGE_PAD) == 24
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
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = tokenizer.decode(expected, skip_special_tokens=True)
    assert body["choices"][0]["message"]["content"] == text


def test_tokenize_counts_the_image(setup: tuple, client: Any) -> None:
    folder, hf = setup
    image = png_bytes(31, SIZE)
    prompt, _ = hf_greedy(hf, folder, RENDERED, [image], 1)
    r = client.post(
        "/v1/tokenize", json={"model": MODEL, "messages": _messages([_image(data_url(image))])}
    )
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == prompt


def test_a_video_part_is_a_400(client: Any) -> None:
    video = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}
    r = client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": _messages([video]), "max_tokens": 2},
    )
    assert r.status_code == 400, r.text
    assert "video" in r.json()["error"]["message"].lower()
