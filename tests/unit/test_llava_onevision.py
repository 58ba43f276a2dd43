"""LLaVA-OneVision and LLaVA-NeXT on tiny random checkpoints, float32: an image's token count is
the folder's processor's (anyres crops, unpadded to the image's aspect ratio, newline features,
OneVision's anyres_max shrinking and its one-crop images when a request has several), and the
greedy tokens equal transformers' generate with the processor's inputs (one image of several
shapes, two images of different sizes, a large image, text only, in one batch); the expansion
and pixels equal the processor's; the packed features equal transformers' image features; a
repeated image hits the prefix cache and the encoder cache (and a OneVision image as one of
several shares neither with the same image alone); chunked prefill that cuts images into
pieces gives the same tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve import Engine
from radixserve.errors import InvalidRequestError
from radixserve.models.loader import load_model
from radixserve.multimodal.anyres_images import best_resolution
from tests.helpers.tiny_llava import data_url
from tests.helpers.tiny_llava_onevision import (
    FLAVOURS,
    IMAGE_SIZE,
    IMAGE_TOKEN,
    PINPOINTS,
    hf_greedy,
    make_tiny,
    png_bytes,
    processor_inputs,
)

NEW = 8
GREEDY = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
SMALL = (40, 32)  # (width, height): a 2 x 2 grid, which OneVision shrinks
WIDE = (60, 30)  # 1 x 2 crops: 4 x 8 features, which OneVision keeps
TALL = (30, 70)  # 3 x 1 crops, unpadded in width
LARGE = (300, 220)


@pytest.fixture(scope="module", params=FLAVOURS)
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    folder = tmp_path_factory.mktemp(request.param)
    return (
        folder,
        request.param,
        make_tiny(folder, request.param, seed=FLAVOURS.index(request.param)),
    )


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
    return [IMAGE_TOKEN if w == "<image>" else int(w[1:]) for w in text.split()]


def _tokens(engine: Engine, text: str, images: list[bytes]) -> dict:
    return engine.generate(
        input_ids=_ids(text),
        image_data=[data_url(b) for b in images] or None,
        sampling_params=GREEDY,
    )


def test_greedy_equals_transformers(tiny: tuple) -> None:
    folder, flavour, hf = tiny
    cases = [
        ("w1 w5 <image> w6 w7", [png_bytes(0, SMALL)]),
        ("w1 w5 <image> w6 w7", [png_bytes(1, WIDE)]),
        ("w1 w5 <image> w6 w7", [png_bytes(2, TALL)]),
        ("w1 <image> w5 w6 <image> w7", [png_bytes(3, WIDE), png_bytes(4, TALL)]),
        ("w1 w9 <image> w8", [png_bytes(5, LARGE)]),
        ("w1 w5 w6 w7", []),
    ]
    expected = [hf_greedy(hf, folder, flavour, text, imgs, NEW) for text, imgs in cases]
    # The images really change the answer (else this proves little).
    assert expected[0][1] != expected[1][1] and expected[0][1] != expected[5][1]
    with _engine(folder) as engine:
        outs = engine.generate(
            input_ids=[_ids(text) for text, _ in cases],
            image_data=[[data_url(b) for b in imgs] or None for _, imgs in cases],
            sampling_params=GREEDY,
        )
    assert [o["output_ids"] for o in outs] == [tokens for _, tokens in expected]
    counts = [o["meta_info"]["prompt_tokens"] for o in outs]
    assert counts == [len(p) for p, _ in expected]
    # The count follows the image's shape (wide and tall images: other grids).
    assert len({counts[0], counts[1], counts[2]}) == 3


def test_expansion_equals_the_processors(tiny: tuple) -> None:
    """The API side's tokens and pixels equal the processor's, for one image and for two."""
    import numpy as np

    from radixserve.multimodal.anyres_images import AnyresImages
    from radixserve.multimodal.image_source import LoadedImage
    from radixserve.multimodal.request_images import RequestImages

    folder, flavour, _ = tiny
    model = load_model(str(folder), dtype="float32").model
    from radixserve.managers.image_intake import image_prompt

    prompt = image_prompt(model)
    assert prompt is not None and prompt.layout == "anyres"
    assert isinstance(RequestImages(prompt, model_dir=str(folder)).tiled, AnyresImages)
    for text, images in [
        ("w1 <image> w5", [png_bytes(6, WIDE)]),
        ("w1 <image> w5", [png_bytes(7, LARGE)]),
        ("w1 <image> w5 <image> w6", [png_bytes(8, TALL), png_bytes(9, SMALL)]),
    ]:
        theirs = processor_inputs(folder, flavour, text, images)
        loaded = [LoadedImage(b, k) for k, b in enumerate(images)]
        ids, inputs = AnyresImages(str(folder)).expand(_ids(text), prompt, loaded)
        assert ids == theirs["input_ids"][0].tolist()
        for k, im in enumerate(inputs):
            crops = theirs["pixel_values"][k][: im.pixel_values.shape[0]].numpy()
            np.testing.assert_array_equal(im.pixel_values, crops)
            assert set(ids[im.offset : im.offset + im.length]) == {IMAGE_TOKEN}
        one_crop = flavour == "onevision" and len(images) > 1
        assert all((im.anyres is None) == one_crop for im in inputs)


def test_packed_features_equal_transformers(tiny: tuple) -> None:
    from radixserve.multimodal.image_items import ImageItem

    folder, flavour, hf = tiny
    model = load_model(str(folder), dtype="float32").model
    images = [png_bytes(10, SMALL), png_bytes(11, WIDE)]
    inputs = processor_inputs(folder, flavour, "<image> <image>", images)
    kwargs = {"image_sizes": inputs["image_sizes"]}
    if "batch_num_images" in inputs:
        kwargs["batch_num_images"] = inputs["batch_num_images"]
    with torch.no_grad():
        theirs = hf.model.get_image_features(
            pixel_values=inputs["pixel_values"], **kwargs
        ).pooler_output
    for k in range(len(images)):
        pixels = inputs["pixel_values"][k]
        if flavour == "onevision":  # several images: one crop each
            item = ImageItem(pixels[:1], k, 0, 0)
        else:
            height, width = (int(x) for x in inputs["image_sizes"][k])
            rows, cols = (s // IMAGE_SIZE for s in best_resolution(height, width, PINPOINTS))
            grid = (height, width, rows, cols)
            item = ImageItem(pixels[: rows * cols + 1], k, 0, 0, anyres=grid)
        (ours,) = model._encode([item], torch.device("cpu"))
        torch.testing.assert_close(ours, theirs[k])


def test_chunked_prefill_splits_images_correctly(tiny: tuple) -> None:
    folder, flavour, hf = tiny
    text = "w1 <image> w5 w6 <image> w7"
    images = [png_bytes(12, WIDE), png_bytes(13, SMALL)]
    single = "w1 w5 <image> w7"
    with _engine(folder, chunked_prefill_size=7) as engine:
        assert (
            _tokens(engine, text, images)["output_ids"]
            == hf_greedy(hf, folder, flavour, text, images, NEW)[1]
        )
        assert (
            _tokens(engine, single, images[1:])["output_ids"]
            == hf_greedy(hf, folder, flavour, single, images[1:], NEW)[1]
        )


def _counting_encoder(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many crops each vision-encoder call encoded."""
    model = engine.scheduler.step_runner.runner.model
    calls: list[int] = []
    original = model.vision.forward

    def counted(pixels: torch.Tensor) -> torch.Tensor:
        calls.append(int(pixels.shape[0]))
        return original(pixels)

    monkeypatch.setattr(model.vision, "forward", counted)
    return calls


def test_repeated_image_hits_the_prefix_and_encoder_caches(
    tiny: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, flavour, hf = tiny
    image, other = png_bytes(14, WIDE), png_bytes(15, WIDE)
    first, second = "w1 w5 <image> w7 w8", "w1 w5 <image> w40 w41"
    prompt, _ = hf_greedy(hf, folder, flavour, first, [image], 1)
    span = len(prompt) - 4
    with _engine(folder) as engine:
        calls = _counting_encoder(engine, monkeypatch)
        out = _tokens(engine, first, [image])
        assert out["meta_info"]["cached_tokens"] == 0
        assert out["output_ids"] == hf_greedy(hf, folder, flavour, first, [image], NEW)[1]
        # The same image, a new question: the text before it and its whole span are cached.
        out = _tokens(engine, second, [image])
        assert out["meta_info"]["cached_tokens"] == 2 + span
        assert out["output_ids"] == hf_greedy(hf, folder, flavour, second, [image], NEW)[1]
        # Another image of the same size (the same token ids): only the text before it.
        out = _tokens(engine, second, [other])
        assert out["meta_info"]["cached_tokens"] == 2
        # The first image after other text: its features come from the encoder cache.
        third = "w1 w50 w51 <image> w9"
        out = _tokens(engine, third, [image])
        assert out["meta_info"]["cached_tokens"] == 1
        assert out["output_ids"] == hf_greedy(hf, folder, flavour, third, [image], NEW)[1]
        assert calls == [3, 3]  # image and other, three crops each; never image again
        # The image as the first of two: OneVision makes it one crop (other features, other
        # tokens), so it may share neither the cached span nor the encoder entry.
        both = "w1 w5 <image> <image> w9"
        out = _tokens(engine, both, [image, other])
        assert out["output_ids"] == hf_greedy(hf, folder, flavour, both, [image, other], NEW)[1]
        if flavour == "onevision":
            assert out["meta_info"]["cached_tokens"] == 2
            assert calls[2:] == [2]
        else:
            assert out["meta_info"]["cached_tokens"] == 2 + span
            assert calls[2:] == []


def _hub(name: str) -> str:
    """The published layout (llava-onevision-qwen2-0.5b-ov-hf): SigLIP under vision_model."""
    return name.replace("vision_tower.", "vision_tower.vision_model.")


def _newer(name: str) -> str:
    """Everything under model., the language model as model.language_model, lm_head on top."""
    if name.startswith("language_model.lm_head."):
        return name.removeprefix("language_model.")
    if name.startswith("language_model.model."):
        return "model.language_model." + name.removeprefix("language_model.model.")
    return "model." + name


@pytest.mark.parametrize("rename", [_hub, _newer], ids=["hub", "newer"])
def test_other_checkpoint_layouts_load_the_same(tiny: tuple, tmp_path: Path, rename: Any) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    folder, _, _ = tiny
    shutil.copytree(folder, tmp_path / "copy")
    tensors = load_file(str(folder / "model.safetensors"))
    assert "image_newline" in tensors
    save_file(
        {rename(k): v for k, v in tensors.items()}, str(tmp_path / "copy" / "model.safetensors")
    )
    ours = load_model(str(folder), dtype="float32").model.state_dict()
    theirs = load_model(str(tmp_path / "copy"), dtype="float32").model.state_dict()
    assert ours.keys() == theirs.keys() and "vision.image_newline" in ours
    for name, value in ours.items():
        assert torch.equal(value, theirs[name]), name
    torch.testing.assert_close(ours["vision.image_newline"], tensors["image_newline"])


def test_language_model_must_be_one_we_run(tmp_path: Path) -> None:
    """A text_config of another family is refused by name when the model loads."""
    import json

    make_tiny(tmp_path, "next", seed=4)
    config = json.loads((tmp_path / "config.json").read_text())
    config["text_config"]["model_type"] = "gemma2"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="'gemma2' language model is not supported"):
        load_model(str(tmp_path), dtype="float32")


def test_expanded_prompts_and_placeholder_errors(tiny: tuple) -> None:
    """The processor's own ids (a run per image) are taken as they are; placeholders that match
    neither the images nor their counts are a 400 naming the problem."""
    folder, flavour, hf = tiny
    images = [png_bytes(16, TALL), png_bytes(17, WIDE)]
    text = "w1 <image> w5 <image> w6"
    prompt, expected = hf_greedy(hf, folder, flavour, text, images, NEW)
    urls = [data_url(b) for b in images]
    with _engine(folder, limit_mm_data_per_request='{"image": 2}') as engine:
        out = engine.generate(input_ids=prompt, image_data=urls, sampling_params=GREEDY)
        assert out["output_ids"] == expected
        assert out["meta_info"]["prompt_tokens"] == len(prompt)
        short = prompt[: prompt.index(IMAGE_TOKEN)] + prompt[prompt.index(IMAGE_TOKEN) + 1 :]
        with pytest.raises(InvalidRequestError, match="placeholder"):
            engine.generate(input_ids=short, image_data=urls, sampling_params=GREEDY)
        with pytest.raises(InvalidRequestError, match="placeholder"):
            _tokens(engine, "w1 <image> w5", images)
        with pytest.raises(InvalidRequestError, match="at most 2"):
            _tokens(engine, "w1 <image> <image> <image> w5", [*images, images[0]])


def test_next_with_a_mistral_language_model(tmp_path: Path) -> None:
    """LLaVA-NeXT on Mistral (llava-v1.6-mistral): its sliding window as transformers runs it."""
    hf = make_tiny(tmp_path, "next", seed=6, text_type="mistral")
    text = "w1 w5 <image> w6 w7"
    image = png_bytes(18, SMALL)
    prompt, expected = hf_greedy(hf, tmp_path, "next", text, [image], NEW)
    assert len(prompt) > 48  # the window matters
    with _engine(tmp_path) as engine:
        assert _tokens(engine, text, [image])["output_ids"] == expected
