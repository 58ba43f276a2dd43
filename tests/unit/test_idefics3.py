"""Idefics3 and SmolVLM on tiny random checkpoints, float32: the model folder's processor decides
how many tokens each image becomes (tiles plus a global view, with their marker tokens), and the
greedy tokens equal transformers' generate with the processor's inputs (one image, two images of
different tile grids, a large image, text only, in one batch); the expansion equals the
processor's; the vision side equals transformers' image features; a repeated image hits the
prefix cache and the encoder cache; chunked prefill that cuts images and their markers into
pieces gives the same tokens; the per-request image limit and placeholder checks hold."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve import Engine
from radixserve.errors import InvalidRequestError
from radixserve.models.loader import load_model
from tests.helpers.tiny_idefics3 import (
    FAKE_TOKEN,
    FLAVOURS,
    IMAGE_SEQ_LEN,
    IMAGE_TOKEN,
    hf_greedy,
    make_tiny_idefics3,
    png_bytes,
    processor_inputs,
)
from tests.helpers.tiny_llava import data_url

NEW = 8
GREEDY = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
SMALL = (40, 32)  # resized up to 2 x 2 tiles + the global view
WIDE = (100, 30)  # 1 x 2 tiles + the global view
LARGE = (300, 220)  # a large image: resized down to 2 x 2 tiles + the global view


@pytest.fixture(scope="module", params=FLAVOURS)
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    folder = tmp_path_factory.mktemp(request.param)
    # Different seeds: the two flavours are the same architecture.
    return folder, make_tiny_idefics3(folder, request.param, seed=FLAVOURS.index(request.param))


def _engine(folder: Path, **kwargs: Any) -> Engine:
    engine = Engine(
        model_path=str(folder),
        runtime="thread",
        dtype="float32",
        skip_tokenizer_init=True,
        skip_server_warmup=True,
        max_total_tokens=4096,
        attention_backend="torch_native",
        **kwargs,
    )
    engine.scheduler.check_kv_each_step = True
    return engine


def _ids(text: str) -> list[int]:
    """The tiny tokenizer's ids of `text` ("w<i>" is i, "<image>" the image token). The texts
    here avoid words such as "w10" and "w20": the tokenizer reads them as the special "w1" /
    "w2" and an unknown rest."""
    return [IMAGE_TOKEN if w == "<image>" else int(w[1:]) for w in text.split()]


def _tokens(engine: Engine, text: str, images: list[bytes], **params: Any) -> dict:
    return engine.generate(
        input_ids=_ids(text),
        image_data=[data_url(b) for b in images] or None,
        sampling_params={**GREEDY, **params},
    )


def test_greedy_equals_transformers(tiny: tuple) -> None:
    folder, hf = tiny
    cases = [
        ("w1 w5 <image> w6 w7", [png_bytes(0, SMALL)]),
        ("w1 w5 <image> w6 w7", [png_bytes(1, WIDE)]),
        ("w1 <image> w5 w6 <image> w7", [png_bytes(2, SMALL), png_bytes(3, WIDE)]),
        ("w1 w9 <image> w8", [png_bytes(4, LARGE)]),
        ("w1 w5 w6 w7", []),
    ]
    expected = [hf_greedy(hf, folder, text, imgs, NEW) for text, imgs in cases]
    # The images really change the answer (else this proves little).
    assert expected[0][1] != expected[1][1] and expected[0][1] != expected[4][1]
    with _engine(folder) as engine:
        outs = engine.generate(
            input_ids=[_ids(text) for text, _ in cases],
            image_data=[[data_url(b) for b in imgs] or None for _, imgs in cases],
            sampling_params=GREEDY,
        )
    assert [o["output_ids"] for o in outs] == [tokens for _, tokens in expected]
    # Token counts are the processor's: 5 tiles, 3 tiles, both, 5 tiles, none.
    assert [o["meta_info"]["prompt_tokens"] for o in outs] == [len(p) for p, _ in expected]
    assert len(expected[0][0]) != len(expected[1][0])


def test_expansion_equals_the_processors(tiny: tuple) -> None:
    """The API side's tokens and pixels for each image equal the processor's for the text."""
    import numpy as np

    from radixserve.multimodal.image_prompt import ImagePrompt
    from radixserve.multimodal.image_source import LoadedImage
    from radixserve.multimodal.tiled_images import TiledImages

    folder, _ = tiny
    images = [png_bytes(5, WIDE), png_bytes(6, LARGE)]
    text = "w1 <image> w5 <image> w6"
    theirs = processor_inputs(folder, text, images)
    prompt = ImagePrompt(IMAGE_TOKEN, IMAGE_SEQ_LEN, "tiles")
    loaded = [LoadedImage(b, k) for k, b in enumerate(images)]
    ids, inputs = TiledImages(str(folder)).expand(_ids(text), prompt, loaded)
    assert ids == theirs["input_ids"][0].tolist()
    assert [im.pixel_values.shape[0] for im in inputs] == [3, 5]
    pixels = np.concatenate([im.pixel_values for im in inputs])
    np.testing.assert_array_equal(pixels, theirs["pixel_values"][0].numpy())
    for im in inputs:  # each span runs from its first marker to its last
        span = ids[im.offset : im.offset + im.length]
        assert span[0] == FAKE_TOKEN and span[-1] == FAKE_TOKEN
        assert span.count(IMAGE_TOKEN) == im.pixel_values.shape[0] * IMAGE_SEQ_LEN


def test_vision_features_equal_transformers(tiny: tuple) -> None:
    folder, hf = tiny
    model = load_model(str(folder), dtype="float32").model
    inputs = processor_inputs(folder, "<image>", [png_bytes(7, SMALL)])
    ours = model.vision(inputs["pixel_values"][0], inputs["pixel_attention_mask"][0].bool())
    with torch.no_grad():
        theirs = hf.model.get_image_features(
            pixel_values=inputs["pixel_values"],
            pixel_attention_mask=inputs["pixel_attention_mask"],
        ).pooler_output[0]
    torch.testing.assert_close(ours.reshape(-1, ours.shape[-1]), theirs)


def test_chunked_prefill_splits_images_correctly(tiny: tuple) -> None:
    """Chunks of 7 tokens cut tiles, markers and images into pieces at many offsets."""
    folder, hf = tiny
    text = "w1 <image> w5 w6 <image> w7"
    images = [png_bytes(8, WIDE), png_bytes(9, SMALL)]
    _, expected = hf_greedy(hf, folder, text, images, NEW)
    with _engine(folder, chunked_prefill_size=7) as engine:
        assert _tokens(engine, text, images)["output_ids"] == expected


def _counting_encoder(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many tiles each vision-encoder call encoded."""
    model = engine.scheduler.step_runner.runner.model
    calls: list[int] = []
    original = model.vision.forward

    def counted(pixels: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        calls.append(int(pixels.shape[0]))
        return original(pixels, mask)

    monkeypatch.setattr(model.vision, "forward", counted)
    return calls


def test_repeated_image_hits_the_prefix_and_encoder_caches(
    tiny: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, hf = tiny
    image, other = png_bytes(10, WIDE), png_bytes(11, WIDE)
    first, second = "w1 w5 <image> w7 w8", "w1 w5 <image> w40 w41"
    prompt, _ = hf_greedy(hf, folder, first, [image], 1)
    span = len(prompt) - 2 - 2  # the image's tokens, markers included
    with _engine(folder) as engine:
        calls = _counting_encoder(engine, monkeypatch)
        out = _tokens(engine, first, [image])
        assert out["meta_info"]["cached_tokens"] == 0
        assert out["output_ids"] == hf_greedy(hf, folder, first, [image], NEW)[1]
        # The same image, a new question: the text before it and its whole span are cached.
        out = _tokens(engine, second, [image])
        assert out["meta_info"]["cached_tokens"] == 2 + span
        assert out["output_ids"] == hf_greedy(hf, folder, second, [image], NEW)[1]
        # Another image of the same size (the same token ids): only the text before it.
        out = _tokens(engine, second, [other])
        assert out["meta_info"]["cached_tokens"] == 2
        assert out["output_ids"] == hf_greedy(hf, folder, second, [other], NEW)[1]
        # The first image after other text: no prefix to share, its features come from the
        # encoder cache by content hash.
        third = "w1 w50 w51 <image> w9"
        out = _tokens(engine, third, [image])
        assert out["meta_info"]["cached_tokens"] == 1
        assert out["output_ids"] == hf_greedy(hf, folder, third, [image], NEW)[1]
        assert calls == [3, 3]  # image and other, three tiles each; never image again


def test_image_limit_and_placeholders(tiny: tuple) -> None:
    folder, _ = tiny
    image = png_bytes(12, SMALL)
    with _engine(folder, limit_mm_data_per_request='{"image": 1}') as engine:
        with pytest.raises(InvalidRequestError, match="at most 1"):
            _tokens(engine, "w1 <image> <image> w7", [image, image])
        with pytest.raises(InvalidRequestError, match="placeholder"):
            _tokens(engine, "w1 w5 w7", [image])
        assert len(_tokens(engine, "w1 <image> w7", [image])["output_ids"]) == NEW


def test_cached_prefix_ending_inside_an_image(tiny: tuple) -> None:
    """A prompt that ends with its image: a repeat matches all but its last token, a marker
    (<fake_token_around_image>), so the step runs a piece of the image with no image token."""
    folder, hf = tiny
    image = png_bytes(13, WIDE)
    text = "w1 w5 <image>"
    prompt, expected = hf_greedy(hf, folder, text, [image], NEW)
    assert prompt[-1] == FAKE_TOKEN
    with _engine(folder) as engine:
        first = _tokens(engine, text, [image])
        again = _tokens(engine, text, [image])
    assert first["output_ids"] == again["output_ids"] == expected
    assert again["meta_info"]["cached_tokens"] == len(prompt) - 1


def test_tied_checkpoint(tmp_path: Path) -> None:
    """tie_word_embeddings at the top level (transformers' flag for these models): lm_head is
    the embedding table, stored or not; the tokens stay transformers'."""
    from safetensors import safe_open

    hf = make_tiny_idefics3(tmp_path, "smolvlm", seed=3, tied=True)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        stored = set(f.keys())
    assert "lm_head.weight" not in stored
    text = "w1 w5 <image> w6"
    image = png_bytes(14, WIDE)
    _, expected = hf_greedy(hf, tmp_path, text, [image], NEW)
    with _engine(tmp_path) as engine:
        assert _tokens(engine, text, [image])["output_ids"] == expected
