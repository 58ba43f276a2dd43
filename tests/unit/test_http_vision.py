"""A tiny LLaVA served over HTTP: OpenAI chat with image_url parts (data URLs, through the openai
client too) and /generate's image_data give transformers' greedy tokens; the folder's chat
template writes the placeholders; a repeated image is served from the prefix cache; bad images
are 400s with the OpenAI error body naming the message part, and the server keeps serving."""

from __future__ import annotations

import json
from collections.abc import Iterator
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

NEW = 6
MODEL = "tiny-llava"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("llava")
    return folder, make_tiny_llava(folder)


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
    ) as eng:
        yield eng


@pytest.fixture(scope="module")
def client(engine: Engine) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from radixserve.entrypoints.http_server import create_app

    with TestClient(create_app(engine, engine.server_args), raise_server_exceptions=False) as c:
        yield c


def _chat(image: str, question: str = "w7 w8") -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "w5 "},
                    {"type": "image_url", "image_url": {"url": image}},
                    {"type": "text", "text": f" {question}"},
                ],
            }
        ],
        "max_tokens": NEW,
        "temperature": 0,
        "ignore_eos": True,
    }


def _chat_prompt(tokenizer: Any, question: str = "w7 w8") -> list[int]:
    """What the template renders (one placeholder for the image), as token ids."""
    return tokenizer.encode(f"user : w5 <image> {question} w3 w4", add_special_tokens=False)


def test_chat_with_data_url_image_equals_transformers(
    setup: tuple, engine: Engine, client: Any
) -> None:
    folder, hf = setup
    image = png_bytes(20)
    ids = _chat_prompt(engine.tokenizer)
    assert ids.count(IMAGE_TOKEN) == 1
    expected = hf_llava_greedy(hf, folder, ids, [image], NEW)
    r = client.post("/v1/chat/completions", json=_chat(data_url(image)))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["prompt_tokens"] == len(ids) - 1 + TOKENS_PER_IMAGE
    assert body["choices"][0]["message"]["content"] == engine.tokenizer.decode(expected)
    # The same image with another question: its prefix (the image included) is cached.
    before = engine.scheduler.stats.cached_prompt_tokens
    r = client.post("/v1/chat/completions", json=_chat(data_url(image), "w9"))
    assert r.status_code == 200, r.text
    # "user", ":" (unknown words) and w5 come before the image.
    assert engine.scheduler.stats.cached_prompt_tokens - before == 3 + TOKENS_PER_IMAGE


def test_generate_image_data_equals_transformers(setup: tuple, client: Any) -> None:
    folder, hf = setup
    images = [png_bytes(21), png_bytes(22)]
    ids = [1, 5, IMAGE_TOKEN, 6, IMAGE_TOKEN, 7]
    expected = hf_llava_greedy(hf, folder, ids, images, NEW)
    params = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
    r = client.post(
        "/generate",
        json={
            "input_ids": ids,
            "image_data": [data_url(b) for b in images],
            "sampling_params": params,
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["output_ids"] == expected
    # A text prompt with the placeholder written as text, one image given as a string.
    r = client.post(
        "/generate",
        json={
            "text": "w5 <image> w6",
            "image_data": data_url(images[0]),
            "sampling_params": params,
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["prompt_tokens"] == 2 + TOKENS_PER_IMAGE


def test_bad_images_are_openai_400s(client: Any) -> None:
    r = client.post("/v1/chat/completions", json=_chat(data_url(b"not an image")))
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "messages[0].content[1].image_url"
    assert "decoded" in error["message"]
    r = client.post("/v1/chat/completions", json=_chat("https://example.invalid/cat.png"))
    assert r.status_code == 400 and "not fetched" in r.json()["error"]["message"]
    r = client.post(
        "/generate", json={"input_ids": [1, IMAGE_TOKEN], "image_data": "data:image/png;base64,@"}
    )
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("image_data")
    r = client.post("/v1/chat/completions", json=_chat(data_url(png_bytes(23))))
    assert r.status_code == 200, r.text


def test_openai_client_sends_an_image(engine: Engine) -> None:
    openai = pytest.importorskip("openai")
    from radixserve.entrypoints.http_server import create_app
    from tests.helpers.thread_server import serve_app

    with serve_app(create_app(engine, engine.server_args)) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none")
        body = _chat(data_url(png_bytes(24)))
        body["extra_body"] = {"ignore_eos": body.pop("ignore_eos")}
        reply = client.chat.completions.create(**body)
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.prompt_tokens > TOKENS_PER_IMAGE


def test_model_info_reports_image_understanding(client: Any) -> None:
    info = client.get("/model_info").json()
    assert info["has_image_understanding"] is True
    assert info["architectures"] == ["LlavaForConditionalGeneration"]


def test_tokenize_counts_the_expanded_image(engine: Engine, client: Any) -> None:
    body = _chat(data_url(png_bytes(25)))
    r = client.post("/v1/tokenize", json={"model": MODEL, "messages": body["messages"]})
    assert r.status_code == 200, r.text
    tokens = r.json()["tokens"]
    assert tokens.count(IMAGE_TOKEN) == TOKENS_PER_IMAGE
    assert len(tokens) == len(_chat_prompt(engine.tokenizer)) - 1 + TOKENS_PER_IMAGE


def test_generate_batch_with_n_and_per_prompt_images(setup: tuple, client: Any) -> None:
    """One entry per prompt (an image, or null for a text prompt); each of n copies gets its
    prompt's images; streamed answers carry the same tokens."""
    folder, hf = setup
    image = png_bytes(26)
    prompts = [[1, 5, IMAGE_TOKEN, 6], [1, 5, 6]]
    expected = [
        hf_llava_greedy(hf, folder, prompts[0], [image], NEW),
        hf_llava_greedy(hf, folder, prompts[1], [], NEW),
    ]
    params = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True, "n": 2}
    body = {"input_ids": prompts, "image_data": [data_url(image), None], "sampling_params": params}
    r = client.post("/generate", json=body)
    assert r.status_code == 200, r.text
    assert [o["output_ids"] for o in r.json()] == [expected[0]] * 2 + [expected[1]] * 2
    params["n"] = 1
    r = client.post(
        "/generate",
        json={
            "input_ids": prompts[0],
            "image_data": data_url(image),
            "sampling_params": params,
            "stream": True,
        },
    )
    assert r.status_code == 200, r.text
    events = [line[len("data: ") :] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    streamed = chunks[-1]["output_ids"]
    if len(streamed) < NEW:  # incremental chunks: their ids in order
        streamed = [t for c in chunks for t in c["output_ids"]]
    assert streamed == expected[0]
