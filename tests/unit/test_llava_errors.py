"""Bad images are the request's own 400 (InvalidRequestError naming image_data), never a crash:
undecodable data, bad base64, http(s) URLs (not fetched), unreadable paths, placeholders that do
not match the images, more images than --limit-mm-data-per-request, images for a text-only
model; the engine serves the next request as before."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from radixserve import Engine
from radixserve.errors import InvalidRequestError
from tests.helpers.tiny_llava import IMAGE_TOKEN, data_url, make_tiny_llava, png_bytes
from tests.unit.tiny_model import make_tiny_engine, write_tiny_llama

GREEDY = {"max_new_tokens": 4, "temperature": 0}
PROMPT = [1, 5, IMAGE_TOKEN, 7]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("llava")
    make_tiny_llava(folder)
    with Engine(
        model_path=str(folder),
        runtime="thread",
        dtype="float32",
        skip_tokenizer_init=True,
        skip_server_warmup=True,
        max_total_tokens=2048,
        attention_backend="torch_native",
        limit_mm_data_per_request='{"image": 2}',
        enable_multimodal=True,  # SGLang's switch: accepted, LLaVA takes images either way
    ) as eng:
        yield eng


BAD = {
    "not an image": data_url(b"hello, not a picture"),
    "truncated png": data_url(png_bytes(1)[:60]),
    "bad base64": "data:image/png;base64,@@@",
    "not base64 at all": "!!",
    "http url": "https://example.invalid/cat.png",
    "missing file": "/nonexistent/cat.png",
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_image_is_a_client_error(engine: Any, name: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        engine.generate(input_ids=PROMPT, image_data=BAD[name], sampling_params=GREEDY)
    assert err.value.param.startswith("image_data")
    good = engine.generate(
        input_ids=PROMPT, image_data=data_url(png_bytes(2)), sampling_params=GREEDY
    )
    assert len(good["output_ids"]) == 4


def test_file_path_and_bare_base64_are_read(engine: Any, tmp_path: Path) -> None:
    data = png_bytes(3)
    path = tmp_path / "cat.png"
    path.write_bytes(data)
    outs = [
        engine.generate(input_ids=PROMPT, image_data=src, sampling_params=GREEDY)["output_ids"]
        for src in (str(path), base64.b64encode(data).decode(), data_url(data))
    ]
    assert outs[0] == outs[1] == outs[2]


def test_placeholders_must_match_the_images(engine: Any) -> None:
    image = data_url(png_bytes(4))
    with pytest.raises(InvalidRequestError, match="placeholder"):
        engine.generate(input_ids=[1, 5, 7], image_data=image, sampling_params=GREEDY)
    with pytest.raises(InvalidRequestError, match="placeholder"):
        engine.generate(input_ids=PROMPT, image_data=[image, image], sampling_params=GREEDY)


def test_image_limit_per_request(engine: Any) -> None:
    image = data_url(png_bytes(5))
    ids = [1, IMAGE_TOKEN, IMAGE_TOKEN, IMAGE_TOKEN, 7]
    with pytest.raises(InvalidRequestError, match="at most 2"):
        engine.generate(input_ids=ids, image_data=[image] * 3, sampling_params=GREEDY)
    two = engine.generate(
        input_ids=ids[:2] + ids[3:], image_data=[image] * 2, sampling_params=GREEDY
    )
    assert len(two["output_ids"]) == 4


def test_text_only_model_refuses_images(tmp_path: Path) -> None:
    engine = make_tiny_engine(write_tiny_llama(tmp_path / "llama"))
    try:
        with pytest.raises(InvalidRequestError, match="text only") as err:
            engine.generate(
                input_ids=[1, 5, 7], image_data=data_url(png_bytes(6)), sampling_params=GREEDY
            )
        assert err.value.param == "image_data"
        assert len(engine.generate(input_ids=[1, 5, 7], sampling_params=GREEDY)["output_ids"]) == 4
    finally:
        engine.shutdown()


def test_a_request_refused_by_the_scheduler_leaves_its_batch_alone(
    engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An image the scheduler's processor refuses ends that request alone (abort, 400) while
    the request submitted with it runs."""
    bad, good = png_bytes(7), png_bytes(8)
    expected = engine.generate(input_ids=PROMPT, image_data=data_url(good), sampling_params=GREEDY)
    images = engine.scheduler.images
    prepare = images.prepare

    def picky(inputs: Any) -> Any:
        if any(image.data == bad for image in inputs):
            raise InvalidRequestError("Image 0 could not be processed: broken", "image_data")
        return prepare(inputs)

    monkeypatch.setattr(images, "prepare", picky)
    outs = engine.generate(
        input_ids=[PROMPT, PROMPT],
        image_data=[data_url(bad), data_url(good)],
        sampling_params=GREEDY,
    )
    reason = outs[0]["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and reason["status_code"] == 400
    assert "could not be processed" in reason["message"]
    assert outs[1]["output_ids"] == expected["output_ids"]


@pytest.mark.parametrize("limit", ['{"image": -1}', '{"image": "two"}', "[2]"])
def test_bad_image_limit_is_refused_before_start(tmp_path: Path, limit: str) -> None:
    with pytest.raises(ValueError, match="limit-mm-data-per-request"):
        Engine(model_path=str(tmp_path), runtime="thread", limit_mm_data_per_request=limit)


def test_images_in_a_session_are_refused(engine: Any) -> None:
    session = engine.open_session(capacity_of_str_len=1000)
    try:
        with pytest.raises(InvalidRequestError, match="session") as err:
            engine.generate(
                input_ids=PROMPT,
                image_data=data_url(png_bytes(9)),
                sampling_params=GREEDY,
                session_params={"id": session},
            )
        assert err.value.param == "image_data"
    finally:
        engine.close_session(session)
