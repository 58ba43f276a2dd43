"""Gemma 3 with its vision tower (Gemma3ForConditionalGeneration) on a tiny random checkpoint,
float32: greedy tokens equal transformers' generate on Gemma3Processor's inputs (one image, two
images, text only) on both attention backends, with images longer than the sliding window so
both the bidirectional image mask and the window matter; the API side's placeholder expansion
equals the processor's; a repeated image hits the prefix cache; chunked prefill keeps images
whole (and a chunk size under one image is refused); the published checkpoints' tensor names
load; the cached prefix that ends inside an image; OpenAI chat over HTTP."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve import Engine
from radixserve.managers.image_chunking import check_chunk_size, whole_image_take
from radixserve.models.loader import load_model
from tests.helpers.family_check import BACKENDS
from tests.helpers.tiny_gemma3_vision import (
    BOI,
    EOI,
    NEWLINES,
    SOFT,
    TOKENS_PER_IMAGE,
    hf_greedy,
    make_tiny_gemma3_vision,
    processor,
    prompt_text,
)
from tests.helpers.tiny_llava import data_url, png_bytes

NEW = 8
GREEDY = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
WORDS = list(range(10, 40))
ONE = prompt_text(WORDS, [4])
TWO = prompt_text(WORDS, [3, 12])


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("gemma3v")
    return folder, make_tiny_gemma3_vision(folder)


@pytest.fixture(scope="module")
def images() -> list[bytes]:
    return [png_bytes(seed, (64, 48)) for seed in range(3)]


def _engine(folder: Path, backend: str = "torch_native", **kwargs: Any) -> Engine:
    engine = Engine(
        model_path=str(folder),
        runtime="thread",
        dtype="float32",
        skip_tokenizer_init=True,
        skip_server_warmup=True,
        max_total_tokens=2048,
        attention_backend=backend,
        **kwargs,
    )
    engine.scheduler.check_kv_each_step = True
    return engine


def _cases(images: list[bytes]) -> list[tuple[str, list[bytes]]]:
    return [
        (ONE, [images[0]]),
        (ONE, [images[1]]),
        (TWO, [images[1], images[2]]),
        (prompt_text(WORDS, []), []),
    ]


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_equals_transformers(gemma: tuple, images: list[bytes], backend: str) -> None:
    folder, hf = gemma
    cases = _cases(images)
    expected = [hf_greedy(hf, folder, text, imgs, NEW) for text, imgs in cases]
    # The images really change the answer (else this proves little).
    assert expected[0][1] != expected[1][1] and expected[0][1] != expected[3][1]
    with _engine(folder, backend) as engine:
        # One batch: different images side by side, and a text-only request.
        outs = engine.generate(
            input_ids=[ids for ids, _ in expected],
            image_data=[[data_url(b) for b in imgs] or None for _, imgs in cases],
            sampling_params=GREEDY,
        )
    assert [o["output_ids"] for o in outs] == [tokens for _, tokens in expected]


def test_the_image_mask_matters(
    gemma: tuple, images: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the bidirectional image blocks the logits differ: the mask is exercised."""
    from radixserve.layers.attention import base

    folder, hf = gemma
    ids, _ = hf_greedy(hf, folder, TWO, [images[1], images[2]], 1)
    params = {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}

    def top_logprobs() -> list[Any]:
        with _engine(folder) as engine:
            out = engine.generate(
                input_ids=ids,
                image_data=[data_url(images[1]), data_url(images[2])],
                sampling_params=params,
                return_logprob=True,
                top_logprobs_num=3,
            )
        return out["meta_info"]["output_top_logprobs"][0]

    with_mask = top_logprobs()
    monkeypatch.setattr(base, "recompute_block_rows", lambda out, *args: out)
    assert top_logprobs() != with_mask


def test_text_prompt_expands_as_the_processor(gemma: tuple, images: list[bytes]) -> None:
    """A text prompt with one `<start_of_image>` per image, tokenized and expanded on the API
    side, runs the processor's ids: the same tokens as transformers."""
    folder, hf = gemma
    ids, expected = hf_greedy(hf, folder, TWO, [images[1], images[2]], NEW)
    assert ids.count(SOFT) == 2 * TOKENS_PER_IMAGE and ids.count(NEWLINES) == 4
    engine = Engine(
        model_path=str(folder),
        runtime="thread",
        dtype="float32",
        skip_server_warmup=True,
        max_total_tokens=2048,
    )
    with engine:
        out = engine.generate(
            prompt=TWO,
            image_data=[data_url(images[1]), data_url(images[2])],
            sampling_params=GREEDY,
        )
    assert out["meta_info"]["prompt_tokens"] == len(ids)
    assert out["output_ids"] == expected


def test_expansion_equals_gemma3_processor(gemma: tuple, images: list[bytes]) -> None:
    from PIL import Image

    from radixserve.multimodal.image_prompt import ImagePrompt, expand_placeholders

    folder, _ = gemma
    proc = processor(folder)
    rgb = [Image.open(io.BytesIO(b)).convert("RGB") for b in images[:2]]
    theirs = proc(text=TWO, images=rgb, return_tensors="pt")["input_ids"][0].tolist()
    prompt = ImagePrompt(
        BOI, TOKENS_PER_IMAGE, feature_token_id=SOFT, before=(NEWLINES, BOI), after=(EOI, NEWLINES)
    )
    ours, spans = expand_placeholders(proc.tokenizer.encode(TWO), prompt, 2)
    assert ours == theirs
    assert [ours[s.offset : s.offset + s.length] for s in spans] == [[SOFT] * 16] * 2
    # The processor's output is kept as it is; a count that disagrees is a 400.
    assert expand_placeholders(theirs, prompt, 2)[0] == theirs
    from radixserve.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="image"):
        expand_placeholders(theirs, prompt, 1)


def test_a_repeated_image_hits_the_prefix_cache(gemma: tuple, images: list[bytes]) -> None:
    folder, hf = gemma
    ids, expected = hf_greedy(hf, folder, ONE, [images[0]], NEW)
    other_ids, other = hf_greedy(hf, folder, ONE, [images[1]], NEW)
    with _engine(folder) as engine:
        runs = [
            engine.generate(input_ids=i, image_data=[data_url(b)], sampling_params=GREEDY)
            for i, b in [(ids, images[0]), (ids, images[0]), (other_ids, images[1])]
        ]
    cached = [r["meta_info"]["cached_tokens"] for r in runs]
    image_end = ids.index(EOI)
    assert cached[1] >= image_end and cached[2] < ids.index(SOFT) + 1
    assert [r["output_ids"] for r in runs] == [expected, expected, other]


@pytest.mark.parametrize("chunk", [TOKENS_PER_IMAGE, 20, 27])
def test_chunked_prefill_keeps_images_whole(
    gemma: tuple, images: list[bytes], chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from radixserve.models import gemma3_vision

    folder, hf = gemma
    ids, expected = hf_greedy(hf, folder, TWO, [images[1], images[2]], NEW)
    one_ids, one = hf_greedy(hf, folder, ONE, [images[0]], NEW)
    seen: list[tuple[int, int, int]] = []
    original = gemma3_vision.image_blocks

    def spy(chunks: Any) -> Any:
        seen.extend((c.start, c.length, c.image.length) for c in chunks)
        return original(chunks)

    monkeypatch.setattr(gemma3_vision, "image_blocks", spy)
    with _engine(folder, chunked_prefill_size=chunk) as engine:
        # Two requests: the second's chunks share the budget with the first's.
        outs = engine.generate(
            input_ids=[ids, one_ids],
            image_data=[[data_url(images[1]), data_url(images[2])], [data_url(images[0])]],
            sampling_params=GREEDY,
        )
    assert [o["output_ids"] for o in outs] == [expected, one]
    assert seen == [(0, TOKENS_PER_IMAGE, TOKENS_PER_IMAGE)] * 3


def test_chunk_size_under_one_image_is_refused(gemma: tuple) -> None:
    with pytest.raises(ValueError, match="chunked-prefill-size 8 is smaller than one image"):
        check_chunk_size(8, TOKENS_PER_IMAGE)
    folder, _ = gemma
    with pytest.raises(Exception, match="chunked-prefill-size"):
        _engine(folder, chunked_prefill_size=8)


class _Span:
    def __init__(self, offset: int, length: int) -> None:
        self.offset, self.end = offset, offset + length


def test_whole_image_take() -> None:
    spans = [_Span(10, 16), _Span(30, 16)]
    assert whole_image_take(spans, 0, 20, 60, 1, grow=False) == 10  # cut before the image
    assert whole_image_take(spans, 10, 20, 50, 1, grow=False) == 20  # ends between images
    assert whole_image_take(spans, 10, 25, 50, 1, grow=False) == 20
    assert whole_image_take(spans, 0, 60, 60, 1, grow=False) == 60  # the rest: whole
    # A cut on a page boundary; with no room before the image, run past it (page-rounded).
    assert whole_image_take(spans, 8, 8, 52, 4, grow=False) == 0
    assert whole_image_take(spans, 8, 8, 52, 4, grow=True) == 20
    assert whole_image_take(spans, 0, 12, 60, 4, grow=False) == 8


def test_published_tensor_names_load(gemma: tuple, tmp_path: Path) -> None:
    """Names as the hub checkpoints lay them out (vision_model level, language_model.model.*)
    and as transformers 5 saves them load to the same model."""
    from safetensors.torch import load_file, save_file

    folder, _ = gemma
    import shutil

    for f in folder.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, tmp_path / f.name)
    tensors = load_file(folder / "model.safetensors")
    renamed = {}
    for name, t in tensors.items():
        name = name.replace("vision_tower.", "vision_tower.vision_model.")
        renamed[name.replace("language_model.model.", "model.language_model.")] = t
    save_file(renamed, tmp_path / "model.safetensors")
    a = load_model(str(folder), dtype="float32").model
    b = load_model(str(tmp_path), dtype="float32").model
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert pa.keys() == pb.keys()
    for name, value in pa.items():
        assert torch.equal(value, pb[name]), name


def test_vision_features_equal_transformers(gemma: tuple) -> None:
    folder, hf = gemma
    model = load_model(str(folder), dtype="float32").model
    pixels = torch.randn(2, 3, 56, 56, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs = hf.model.get_image_features(pixels).pooler_output
    torch.testing.assert_close(model.vision(pixels), theirs)


def test_text_only_request_equals_the_text_model(gemma: tuple, tmp_path: Path) -> None:
    """A request without images on the VLM gives the tokens of Gemma 3's text model holding
    the same language-model weights (transformers' Gemma3ForCausalLM, and ours served from a
    text-only folder)."""
    from transformers import Gemma3ForCausalLM

    folder, hf = gemma
    text = Gemma3ForCausalLM(hf.config.text_config).to(torch.float32).eval()
    text.model.load_state_dict(hf.model.language_model.state_dict())
    text.lm_head.weight = text.model.embed_tokens.weight
    text.save_pretrained(tmp_path)
    ids = [1, *range(10, 40)]
    with torch.no_grad():
        out = text.generate(
            torch.tensor([ids]), do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW
        )
    expected = out[0, len(ids) :].tolist()
    with _engine(folder) as engine:
        assert engine.generate(input_ids=ids, sampling_params=GREEDY)["output_ids"] == expected
    with _engine(tmp_path) as engine:
        assert engine.generate(input_ids=ids, sampling_params=GREEDY)["output_ids"] == expected


def test_cached_prefix_ending_inside_an_image(gemma: tuple, images: list[bytes]) -> None:
    """A prompt that ends with its image's soft tokens: a repeat matches all but its last
    token, so the step runs only the image's last token, which must still see the whole image
    (its earlier tokens from the cache, run whole the first time)."""
    from PIL import Image

    folder, hf = gemma
    proc = processor(folder)
    rgb = [Image.open(io.BytesIO(images[2])).convert("RGB")]
    inputs = proc(text=ONE, images=rgb, return_tensors="pt")
    cut = inputs["input_ids"][0].tolist().index(EOI)
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        inputs[key] = inputs[key][:, :cut]
    with torch.no_grad():
        out = hf.generate(**inputs, do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW)
    ids, expected = inputs["input_ids"][0].tolist(), out[0, cut:].tolist()
    assert ids[-1] == SOFT
    with _engine(folder) as engine:
        runs = [
            engine.generate(input_ids=ids, image_data=data_url(images[2]), sampling_params=GREEDY)
            for _ in range(2)
        ]
    assert [r["meta_info"]["cached_tokens"] for r in runs] == [0, len(ids) - 1]
    assert [r["output_ids"] for r in runs] == [expected, expected]


def test_chat_with_an_image_equals_transformers(gemma: tuple, images: list[bytes]) -> None:
    """OpenAI chat over HTTP: the template writes `<start_of_image>` for the image part, the
    server expands it as Gemma3Processor does, and the answer is transformers'."""
    from fastapi.testclient import TestClient

    from radixserve.entrypoints.http_server import create_app

    folder, hf = gemma
    ids, expected = hf_greedy(
        hf, folder, "user : w5 <start_of_image> w7 w8 w4 w5", [images[0]], NEW
    )
    body = {
        "model": "gemma3v",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "w5 "},
                    {"type": "image_url", "image_url": {"url": data_url(images[0])}},
                    {"type": "text", "text": " w7 w8"},
                ],
            }
        ],
        "max_tokens": NEW,
        "temperature": 0,
        "ignore_eos": True,
    }
    engine = Engine(
        model_path=str(folder),
        runtime="thread",
        dtype="float32",
        skip_server_warmup=True,
        max_total_tokens=2048,
        served_model_name="gemma3v",
    )
    with engine, TestClient(create_app(engine, engine.server_args)) as client:
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(ids)
        answer = r.json()["choices"][0]["message"]["content"]
        assert answer and answer == engine.tokenizer.decode(expected, skip_special_tokens=True)


def test_pan_and_scan_is_turned_off(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A processor config asking for pan-and-scan crops (image sequences the prompt does not
    hold) is served with the whole image only, the crops not computed, with a warning."""
    import json

    from radixserve.messages import ImageInput
    from radixserve.multimodal.image_items import ImagePreprocessor

    processor(tmp_path).save_pretrained(tmp_path)
    path = tmp_path / "processor_config.json"
    config = json.loads(path.read_text())
    config["image_processor"].update(
        do_pan_and_scan=True,
        pan_and_scan_min_crop_size=8,
        pan_and_scan_max_num_crops=4,
        pan_and_scan_min_ratio_to_activate=1.2,
    )
    path.write_text(json.dumps(config))
    wide = png_bytes(1, (200, 50))  # wide enough for crops
    items = ImagePreprocessor(tmp_path, 56).prepare([ImageInput(wide, 1, 0, TOKENS_PER_IMAGE)])
    assert items[0].pixel_values.shape == (3, 56, 56)
    assert "do_pan_and_scan is not supported" in caplog.text
