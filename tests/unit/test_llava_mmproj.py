"""A GGUF language model with llama.cpp's mmproj vision file beside it serves as the LLaVA it was
converted from: the tiny random LLaVA written as the pair (tests/helpers/tiny_mmproj.py) gives
the same greedy tokens, with images, as the same model served from safetensors and as
transformers; the image processor comes from the mmproj metadata; the blocks path
(--quantization gguf) loads the vision side too; bad pairs are refused by name."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve import Engine
from radixserve.models import gguf
from radixserve.models.gguf_mmproj import find_mmproj, read_vision
from radixserve.models.loader import load_model
from radixserve.utils.cache_dir import CACHE_DIR_ENV
from tests.helpers.tiny_gguf import write_tiny_gguf
from tests.helpers.tiny_llava import (
    IMAGE_TOKEN,
    data_url,
    hf_llava_greedy,
    make_tiny_llava,
    png_bytes,
)
from tests.helpers.tiny_mmproj import (
    MERGES,
    TOKENS,
    language_model,
    write_language_gguf,
    write_mmproj,
)

NEW = 8
GREEDY = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
ONE = [1, 5, 6, IMAGE_TOKEN, 7, 8, 9]
TWO = [1, 5, IMAGE_TOKEN, 6, 7, IMAGE_TOKEN, 8, 9]
# Not CLIP's defaults, so a processor that ignored the file's metadata would differ.
MEAN = [0.5, 0.4, 0.3]
STD = [0.2, 0.25, 0.3]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Any]]:
    """(safetensors folder, GGUF folder with model.gguf + mmproj-model.gguf, transformers'
    model), the GGUF cache in a temp folder."""
    import os

    from transformers import CLIPImageProcessor

    root = tmp_path_factory.mktemp("mmproj")
    folder = root / "hf"
    hf = make_tiny_llava(folder)
    processor = CLIPImageProcessor.from_pretrained(folder)
    processor.image_mean, processor.image_std = MEAN, STD
    processor.save_pretrained(folder)
    pair_dir = root / "gguf"
    pair_dir.mkdir()
    write_language_gguf(pair_dir / "tiny-llava.gguf", hf)
    write_mmproj(pair_dir / "mmproj-tiny-llava-f32.gguf", hf, MEAN, STD)
    previous = os.environ.get(CACHE_DIR_ENV)
    os.environ[CACHE_DIR_ENV] = str(root / "cache")
    yield folder, pair_dir, hf
    if previous is None:
        os.environ.pop(CACHE_DIR_ENV, None)
    else:
        os.environ[CACHE_DIR_ENV] = previous


def _engine(path: Path, **kwargs: Any) -> Engine:
    return Engine(
        model_path=str(path),
        runtime="thread",
        dtype="float32",
        skip_tokenizer_init=True,
        skip_server_warmup=True,
        max_total_tokens=2048,
        **kwargs,
    )


def _greedy(path: Path, cases: list[tuple[list[int], list[bytes]]], **kwargs: Any) -> list:
    with _engine(path, **kwargs) as engine:
        outs = engine.generate(
            input_ids=[ids for ids, _ in cases],
            image_data=[[data_url(b) for b in imgs] or None for _, imgs in cases],
            sampling_params=GREEDY,
        )
    return [o["output_ids"] for o in outs]


def test_metadata_and_converted_folder(pair: tuple) -> None:
    _, pair_dir, _ = pair
    mmproj = find_mmproj(pair_dir / "tiny-llava.gguf")
    assert mmproj is not None and mmproj.name == "mmproj-tiny-llava-f32.gguf"
    vision = read_vision(mmproj)
    assert (vision.image_size, vision.patch_size, vision.num_layers) == (28, 7, 2)
    assert list(vision.image_mean) == pytest.approx(MEAN)
    # The folder (not only the file) finds the language model, the mmproj file left aside.
    assert gguf.find_gguf_file(pair_dir) == pair_dir / "tiny-llava.gguf"
    converted = gguf.ensure_converted(pair_dir / "tiny-llava.gguf")
    config = json.loads((converted / "config.json").read_text())
    assert config["architectures"] == ["LlavaForConditionalGeneration"]
    assert config["image_token_index"] == IMAGE_TOKEN
    processor = json.loads((converted / "preprocessor_config.json").read_text())
    assert processor["image_mean"] == pytest.approx(MEAN)
    assert processor["crop_size"] == {"height": 28, "width": 28}


def test_weights_equal_the_safetensors_model(pair: tuple) -> None:
    folder, pair_dir, _ = pair
    ours = load_model(str(pair_dir / "tiny-llava.gguf"), dtype="float32").model.state_dict()
    theirs = load_model(str(folder), dtype="float32").model.state_dict()
    # The converter dropped CLIP's last layer (LLaVA reads the one before): all else is there.
    dropped = {k for k in theirs if ".encoder.layers.2." in k}
    assert dropped and ours.keys() == theirs.keys() - dropped
    for name, value in ours.items():
        torch.testing.assert_close(value, theirs[name], msg=name)


def test_greedy_equals_safetensors_and_transformers(pair: tuple) -> None:
    folder, pair_dir, hf = pair
    images = [png_bytes(seed) for seed in range(3)]
    cases = [(ONE, [images[0]]), (ONE, [images[1]]), (TWO, [images[1], images[2]])]
    expected = [hf_llava_greedy(hf, folder, ids, imgs, NEW) for ids, imgs in cases]
    assert expected[0] != expected[1]  # the image decides the answer
    assert _greedy(folder, cases) == expected
    assert _greedy(pair_dir / "tiny-llava.gguf", cases) == expected


def test_blocks_path_loads_the_vision_side(pair: tuple, tmp_path: Path) -> None:
    """--quantization gguf: the language model's Q8_0 blocks from the file, the vision tower
    and projector from the mmproj file (its matrices Q8_0 too, dequantised); the answer equals
    the dequantised conversion's, and the images still decide it."""
    _, _, hf = pair
    quantized = tmp_path / "q8"
    quantized.mkdir()
    write_language_gguf(quantized / "tiny-llava-q8_0.gguf", hf, quantize=True)
    write_mmproj(quantized / "mmproj-q8_0.gguf", hf, MEAN, STD, quantize=True)
    cases = [(ONE, [png_bytes(5)]), (ONE, [png_bytes(6)])]
    path = quantized / "tiny-llava-q8_0.gguf"
    blocks = load_model(str(path), dtype="float32", gguf_blocks=True).model
    converted = load_model(str(path), dtype="float32").model
    for name, value in converted.state_dict().items():
        if name.startswith("vision."):
            torch.testing.assert_close(blocks.state_dict()[name], value, msg=name)
    expected = _greedy(path, cases)
    assert expected[0] != expected[1]
    assert _greedy(path, cases, quantization="gguf") == expected


def test_bad_pairs_are_refused(pair: tuple, tmp_path: Path) -> None:
    _, pair_dir, _ = pair
    with pytest.raises(ValueError, match="mmproj"):
        gguf.find_gguf_file(pair_dir / "mmproj-tiny-llava-f32.gguf")
    two = tmp_path / "two"
    shutil.copytree(pair_dir, two)
    shutil.copy(two / "mmproj-tiny-llava-f32.gguf", two / "mmproj-other.gguf")
    with pytest.raises(ValueError, match="several mmproj files"):
        find_mmproj(two / "tiny-llava.gguf")
    other = tmp_path / "other"
    other.mkdir()
    import gguf as gguf_py

    writer = gguf_py.GGUFWriter(str(other / "mmproj-x.gguf"), "clip")
    writer.add_string("clip.projector_type", "resampler")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="projector type 'resampler' is not supported"):
        read_vision(other / "mmproj-x.gguf")


def test_vocabulary_without_an_image_token_is_refused(pair: tuple, tmp_path: Path) -> None:
    """llama.cpp's own LLaVA-1.5 conversions have no <image> token: the pair is refused with a
    message saying so, not served with a wrong placeholder."""
    _, _, hf = pair
    tokens = ["w500" if t == "<image>" else t for t in TOKENS]
    write_tiny_gguf(
        tmp_path / "lm.gguf", language_model(hf), quantize=False, tokens=(tokens, MERGES)
    )
    write_mmproj(tmp_path / "mmproj-lm.gguf", hf, MEAN, STD)
    with pytest.raises(ValueError, match="no <image> token"):
        gguf.ensure_converted(tmp_path / "lm.gguf")
    # Without the mmproj file the same GGUF is a text model, as before.
    (tmp_path / "mmproj-lm.gguf").unlink()
    config = json.loads((gguf.ensure_converted(tmp_path / "lm.gguf") / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
