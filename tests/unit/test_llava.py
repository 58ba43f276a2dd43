"""LLaVA-1.5 (LlavaForConditionalGeneration) on a tiny random checkpoint, float32: greedy tokens
with images equal transformers' on both attention backends (one image, two images, a batch of
different images, text only); the image placeholders expand as transformers' LlavaProcessor
expands them; the vision side matches transformers' image features; chunked prefill that cuts
an image into pieces gives the same tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve import Engine
from radixserve.models.loader import load_model
from tests.helpers.family_check import BACKENDS
from tests.helpers.tiny_llava import (
    IMAGE_TOKEN,
    TOKENS_PER_IMAGE,
    data_url,
    hf_llava_greedy,
    make_tiny_llava,
    png_bytes,
)

NEW = 10
GREEDY = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
ONE = [1, 5, 6, IMAGE_TOKEN, 7, 8, 9]
TWO = [1, 5, IMAGE_TOKEN, 6, 7, IMAGE_TOKEN, 8, 9]


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("llava")
    return folder, make_tiny_llava(folder)


@pytest.fixture(scope="module")
def images() -> list[bytes]:
    return [png_bytes(seed) for seed in range(3)]


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


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_equals_transformers(llava: tuple, images: list[bytes], backend: str) -> None:
    folder, hf = llava
    cases = [
        (ONE, [images[0]]),
        (ONE, [images[1]]),
        (TWO, [images[1], images[2]]),
        ([1, 5, 6, 7, 8, 9], []),
    ]
    expected = [hf_llava_greedy(hf, folder, ids, imgs, NEW) for ids, imgs in cases]
    # The images really change the answer (else this proves little).
    assert expected[0] != expected[1] and expected[0] != expected[3]
    with _engine(folder, backend) as engine:
        # One batch: different images side by side.
        outs = engine.generate(
            input_ids=[ids for ids, _ in cases],
            image_data=[[data_url(b) for b in imgs] or None for _, imgs in cases],
            sampling_params=GREEDY,
        )
    assert [o["output_ids"] for o in outs] == expected
    assert outs[0]["meta_info"]["prompt_tokens"] == len(ONE) - 1 + TOKENS_PER_IMAGE


def test_chunked_prefill_splits_images_correctly(llava: tuple, images: list[bytes]) -> None:
    """Chunks of 5 tokens cut each 16-token image into pieces at several offsets."""
    folder, hf = llava
    expected = hf_llava_greedy(hf, folder, TWO, [images[1], images[2]], NEW)
    with _engine(folder, chunked_prefill_size=5) as engine:
        out = engine.generate(
            input_ids=TWO,
            image_data=[data_url(images[1]), data_url(images[2])],
            sampling_params=GREEDY,
        )
    assert out["output_ids"] == expected


def test_placeholders_expand_as_llava_processor(llava: tuple, images: list[bytes]) -> None:
    """The API side's expansion of one placeholder per image equals LlavaProcessor's."""
    import io

    from PIL import Image
    from transformers import AutoImageProcessor, AutoTokenizer, LlavaProcessor

    from radixserve.multimodal.image_prompt import ImagePrompt, expand_placeholders

    folder, _ = llava
    tokenizer = AutoTokenizer.from_pretrained(folder)
    processor = LlavaProcessor(
        AutoImageProcessor.from_pretrained(folder),
        tokenizer,
        patch_size=7,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        image_token="<image>",
    )
    text = "w1 w5 <image> w6 w7 <image> w8"
    rgb = [Image.open(io.BytesIO(b)).convert("RGB") for b in images[:2]]
    theirs = processor(text=text, images=rgb, return_tensors="pt")["input_ids"][0].tolist()
    ours, spans = expand_placeholders(
        tokenizer.encode(text), ImagePrompt(IMAGE_TOKEN, TOKENS_PER_IMAGE), 2
    )
    assert ours == theirs
    assert [s.offset for s in spans] == [2, 4 + TOKENS_PER_IMAGE]


def test_vision_features_equal_transformers(llava: tuple) -> None:
    folder, hf = llava
    model = load_model(str(folder), dtype="float32").model
    pixels = torch.randn(2, 3, 28, 28, generator=torch.Generator().manual_seed(0))
    ours = model.vision(pixels)
    with torch.no_grad():
        theirs = hf.model.get_image_features(
            pixel_values=pixels, vision_feature_layer=-2, vision_feature_select_strategy="default"
        )
    theirs = getattr(theirs, "pooler_output", theirs)
    torch.testing.assert_close(ours, torch.stack(list(theirs)))


def _rename(folder: Path, out: Path, rename: Any) -> None:
    """A copy of the checkpoint folder with its tensors renamed."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(folder, out)
    tensors = load_file(str(folder / "model.safetensors"))
    save_file({rename(k): v for k, v in tensors.items()}, str(out / "model.safetensors"))


HUB = lambda name: name.replace("vision_tower.", "vision_tower.vision_model.")  # noqa: E731


def _newer(name: str) -> str:
    if name.startswith("language_model.lm_head."):
        return name.removeprefix("language_model.")
    if name.startswith("language_model.model."):
        return "model.language_model." + name.removeprefix("language_model.model.")
    return "model." + name


@pytest.mark.parametrize("rename", [HUB, _newer], ids=["hub", "newer"])
def test_other_checkpoint_layouts_load_the_same(llava: tuple, tmp_path: Path, rename: Any) -> None:
    """LLaVA-1.5 on the hub nests CLIP under vision_model.; newer saves put everything under
    model. with lm_head at the top: both load the same weights."""
    folder, _ = llava
    _rename(folder, tmp_path / "copy", rename)
    ours = load_model(str(folder), dtype="float32").model.state_dict()
    theirs = load_model(str(tmp_path / "copy"), dtype="float32").model.state_dict()
    assert ours.keys() == theirs.keys()
    for name, value in ours.items():
        assert torch.equal(value, theirs[name]), name


def test_ngram_speculation_with_images_equals_transformers(
    llava: tuple, images: list[bytes]
) -> None:
    """Verified drafts keep the answer the target gives with its image features."""
    folder, hf = llava
    long = {**GREEDY, "max_new_tokens": 24}
    expected = hf_llava_greedy(hf, folder, ONE, [images[0]], 24)
    with _engine(folder, speculative_algorithm="NGRAM") as engine:
        out = engine.generate(input_ids=ONE, image_data=data_url(images[0]), sampling_params=long)
    assert out["output_ids"] == expected


def test_folder_saved_by_llava_processor(llava: tuple, images: list[bytes], tmp_path: Path) -> None:
    """transformers 5's LlavaProcessor.save_pretrained writes processor_config.json (the image
    processor inside it) instead of preprocessor_config.json: the images are read the same."""
    import shutil

    from transformers import AutoImageProcessor, AutoTokenizer, LlavaProcessor

    folder, hf = llava
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    (copy / "preprocessor_config.json").unlink()
    LlavaProcessor(
        AutoImageProcessor.from_pretrained(folder),
        AutoTokenizer.from_pretrained(folder),
        patch_size=7,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    ).save_pretrained(copy)
    assert (copy / "processor_config.json").is_file()
    with _engine(copy) as engine:
        out = engine.generate(input_ids=ONE, image_data=data_url(images[0]), sampling_params=GREEDY)
    assert out["output_ids"] == hf_llava_greedy(hf, folder, ONE, [images[0]], NEW)
