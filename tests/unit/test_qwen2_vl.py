"""Qwen2-VL and Qwen2.5-VL on tiny random checkpoints, float32: the model folder's image
processor picks each image's resolution, so its patch grid and number of `<|image_pad|>` tokens;
the greedy tokens equal transformers' generate with the processor's inputs (one image, images of
other sizes, two images, text only, all in one batch); M-RoPE positions and rotations equal
transformers'; chunked prefill that cuts images into pieces, and a repeated image with a new
question that hits the prefix cache, give the same tokens; the vision side equals transformers'
image features."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve import Engine
from radixserve.errors import InvalidRequestError
from radixserve.models.loader import load_model
from tests.helpers.tiny_llava import data_url
from tests.helpers.tiny_qwen2vl import (
    FLAVOURS,
    IMAGE_PAD,
    MERGE,
    MROPE_SECTION,
    VISION_END,
    VISION_START,
    hf_greedy,
    make_tiny_qwen2vl,
    png_bytes,
    processor_inputs,
)

NEW = 8
GREEDY = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
IMG = "<|vision_start|><|image_pad|><|vision_end|>"
SMALL = (40, 30)  # 5 x 4 merged patches: 20 tokens
TALL = (24, 56)  # 3 x 7
LARGE = (300, 220)  # resized down to the pixel budget


@pytest.fixture(scope="module", params=FLAVOURS)
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    folder = tmp_path_factory.mktemp(request.param)
    return folder, make_tiny_qwen2vl(folder, request.param, seed=FLAVOURS.index(request.param))


def _engine(folder: Path, **kwargs: Any) -> Engine:
    engine = Engine(
        **{
            "model_path": str(folder),
            "runtime": "thread",
            "dtype": "float32",
            "skip_tokenizer_init": True,
            "skip_server_warmup": True,
            "max_total_tokens": 4096,
            **kwargs,
        }
    )
    engine.scheduler.check_kv_each_step = True
    return engine


def _ids(text: str) -> list[int]:
    """The tiny tokenizer's ids of `text`, each image written as one pad token between the
    vision markers (as the chat template writes it)."""
    out: list[int] = []
    for word in text.split():
        if word == IMG:
            out += [VISION_START, IMAGE_PAD, VISION_END]
        else:
            out.append(int(word[1:]))
    return out


def _tokens(engine: Engine, text: str, images: list[bytes]) -> dict:
    return engine.generate(
        input_ids=_ids(text),
        image_data=[data_url(b) for b in images] or None,
        sampling_params=GREEDY,
    )


def test_greedy_equals_transformers(tiny: tuple) -> None:
    folder, hf = tiny
    cases = [
        (f"w5 {IMG} w6 w7", [png_bytes(0, SMALL)]),
        (f"w5 {IMG} w6 w7", [png_bytes(1, TALL)]),
        (f"w5 {IMG} w8 w9 {IMG} w7", [png_bytes(2, SMALL), png_bytes(3, TALL)]),
        (f"w9 {IMG} w8", [png_bytes(4, LARGE)]),
        ("w5 w6 w7", []),
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
        # Each alone too (a batch of one image request: every step has M-RoPE positions).
        alone = _tokens(engine, *cases[2])
    assert [o["output_ids"] for o in outs] == [tokens for _, tokens in expected]
    assert alone["output_ids"] == expected[2][1]
    # Token counts are the processor's: its grid over merge^2 per image.
    assert [o["meta_info"]["prompt_tokens"] for o in outs] == [len(p) for p, _ in expected]
    assert expected[0][0].count(IMAGE_PAD) == 20 and expected[1][0].count(IMAGE_PAD) == 21


def test_expansion_equals_the_processors(tiny: tuple) -> None:
    """The API side's tokens, patches and grids equal what transformers' processor gives; an
    already expanded prompt is kept, a placeholder count that does not match is refused."""
    import numpy as np

    from radixserve.multimodal.grid_images import GridImages
    from radixserve.multimodal.image_prompt import ImagePrompt
    from radixserve.multimodal.image_source import LoadedImage

    folder, _ = tiny
    images = [png_bytes(5, TALL), png_bytes(6, LARGE)]
    text = f"w5 {IMG} w6 {IMG} w7"
    theirs = processor_inputs(folder, text, images)
    prompt = ImagePrompt(IMAGE_PAD, MERGE * MERGE, "grid")
    loaded = [LoadedImage(b, k) for k, b in enumerate(images)]
    grid = GridImages(str(folder))
    ids, inputs = grid.expand(_ids(text), prompt, loaded)
    assert ids == theirs["input_ids"][0].tolist()
    assert [im.grid_thw for im in inputs] == [tuple(g) for g in theirs["image_grid_thw"].tolist()]
    pixels = np.concatenate([im.pixel_values for im in inputs])
    np.testing.assert_array_equal(pixels, theirs["pixel_values"].numpy())
    for im in inputs:
        assert ids[im.offset - 1] == VISION_START and ids[im.offset + im.length] == VISION_END
        assert set(ids[im.offset : im.offset + im.length]) == {IMAGE_PAD}
    again, _ = grid.expand(ids, prompt, loaded)
    assert again == ids
    with pytest.raises(InvalidRequestError, match="placeholder"):
        grid.expand(_ids("w5 w6"), prompt, loaded[:1])
    with pytest.raises(InvalidRequestError, match="runs do not match"):
        grid.expand([5, IMAGE_PAD, IMAGE_PAD, 6], prompt, loaded[:1])


def test_vision_features_equal_transformers(tiny: tuple) -> None:
    from radixserve.multimodal.image_items import ImageItem

    folder, hf = tiny
    model = load_model(str(folder), dtype="float32").model
    images = [png_bytes(7, SMALL), png_bytes(8, TALL)]
    inputs = processor_inputs(folder, f"{IMG} {IMG}", images)
    grids = [tuple(g) for g in inputs["image_grid_thw"].tolist()]
    patches = inputs["pixel_values"].split([t * h * w for t, h, w in grids])
    items = [
        ImageItem(p, k, 0, t * h * w // MERGE**2, grid_thw=(t, h, w))
        for k, (p, (t, h, w)) in enumerate(zip(patches, grids, strict=True))
    ]
    ours = model._encode(items, torch.device("cpu"))
    with torch.no_grad():
        theirs = hf.model.get_image_features(
            pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"]
        ).pooler_output
    torch.testing.assert_close(torch.cat(ours), torch.cat(list(theirs)))


def test_mrope_positions_and_rotation_equal_transformers(tiny: tuple) -> None:
    """The request's positions (images at different offsets, text after them from max + 1) and
    the rotation M-RoPE gives them equal transformers' get_rope_index and rotary embedding."""
    from radixserve.layers.mrope import MRotaryEmbedding
    from radixserve.multimodal.mrope_positions import GridSpan, mrope_positions

    folder, hf = tiny
    inputs = processor_inputs(
        folder, f"w5 w6 {IMG} w8 {IMG} w7", [png_bytes(9, TALL), png_bytes(10, SMALL)]
    )
    ids = inputs["input_ids"][0].tolist()
    theirs, delta = hf.model.get_rope_index(
        inputs["input_ids"],
        inputs["mm_token_type_ids"],
        image_grid_thw=inputs["image_grid_thw"],
        attention_mask=inputs["attention_mask"],
    )
    starts = [i for i, tok in enumerate(ids) if tok == IMAGE_PAD and ids[i - 1] != IMAGE_PAD]
    spans = [
        GridSpan(at, t, h // MERGE, w // MERGE)
        for at, (t, h, w) in zip(starts, inputs["image_grid_thw"].tolist(), strict=True)
    ]
    ours = mrope_positions(len(ids), spans)
    assert torch.equal(ours.positions, theirs[:, 0])
    assert ours.delta == int(delta) < 0
    # Past the prompt: index + delta on every axis (generated tokens).
    assert ours.take(len(ids) - 1, 3) == [
        [int(theirs[a, 0, -1]), len(ids) + ours.delta, len(ids) + 1 + ours.delta] for a in range(3)
    ]

    hf_rope = hf.model.language_model.rotary_emb
    head_dim = 2 * sum(MROPE_SECTION)
    rope = MRotaryEmbedding(head_dim, head_dim, 256, 10000.0, MROPE_SECTION)
    cos, sin = hf_rope(torch.zeros(1, dtype=torch.float32), theirs)
    rows = rope.table_rows(ours.positions, None)  # type: ignore[arg-type]
    table = rope.cos_sin_cache[rows]
    half = head_dim // 2
    torch.testing.assert_close(table[:, :half], cos[0, :, :half])
    torch.testing.assert_close(table[:, half:], sin[0, :, :half])
    assert bool((rows >= 256).any())  # image tokens read scratch rows; text tokens plain rows


def test_chunked_prefill_splits_images_correctly(tiny: tuple) -> None:
    """Chunks of 6 tokens cut both images (and their M-RoPE positions) into pieces."""
    folder, hf = tiny
    text = f"w5 {IMG} w6 w7 {IMG} w8"
    images = [png_bytes(11, TALL), png_bytes(12, SMALL)]
    _, expected = hf_greedy(hf, folder, text, images, NEW)
    with _engine(folder, chunked_prefill_size=6) as engine:
        assert _tokens(engine, text, images)["output_ids"] == expected


def test_repeated_image_hits_the_prefix_and_encoder_caches(
    tiny: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same image with a new question reuses the prefix through the image (whose positions
    the new suffix continues from); another image of the same size shares only the text."""
    folder, hf = tiny
    image, other = png_bytes(13, SMALL), png_bytes(14, SMALL)
    first, second = f"w5 w6 {IMG} w7 w8", f"w5 w6 {IMG} w40 w41 w42"
    with _engine(folder) as engine:
        model = engine.scheduler.step_runner.runner.model
        calls: list[int] = []
        original = model._encode

        def counted(images: list, device: torch.device) -> list[torch.Tensor]:
            calls.append(len(images))
            return original(images, device)

        monkeypatch.setattr(model, "_encode", counted)
        out = _tokens(engine, first, [image])
        assert out["meta_info"]["cached_tokens"] == 0
        assert out["output_ids"] == hf_greedy(hf, folder, first, [image], NEW)[1]
        out = _tokens(engine, second, [image])
        # w5 w6, <|vision_start|>, 20 image tokens, <|vision_end|>.
        assert out["meta_info"]["cached_tokens"] == 2 + 1 + 20 + 1
        assert out["output_ids"] == hf_greedy(hf, folder, second, [image], NEW)[1]
        out = _tokens(engine, second, [other])
        assert out["meta_info"]["cached_tokens"] == 3
        assert out["output_ids"] == hf_greedy(hf, folder, second, [other], NEW)[1]
        # The first image after other text: its features come from the encoder cache.
        third = f"w9 {IMG} w7"
        out = _tokens(engine, third, [image])
        assert out["output_ids"] == hf_greedy(hf, folder, third, [image], NEW)[1]
    assert calls == [1, 1]


def test_placeholder_mismatch_is_refused(tiny: tuple) -> None:
    folder, _ = tiny
    with _engine(folder) as engine:
        with pytest.raises(InvalidRequestError, match="placeholder"):
            _tokens(engine, "w5 w6 w7", [png_bytes(15, SMALL)])
        assert len(_tokens(engine, f"w5 {IMG} w7", [png_bytes(15, SMALL)])["output_ids"]) == NEW


def test_step_builder_carries_mrope_positions() -> None:
    """An M-RoPE extend's [3, n] positions sit among the others' 1-D ones (all three axes)."""
    from radixserve.model_executor.step_builder import StepBuilder

    step = StepBuilder()
    step.add(0, 0, [1, 2], slots=[0, 1])
    step.add(1, 3, [4, 5, 6], slots=[2, 3, 4], mrope_positions=[[3, 3, 5], [3, 4, 5], [3, 5, 5]])
    built = step.build()
    assert built.positions == [0, 1, 3, 4, 5]
    assert built.mrope_positions.tolist() == [[0, 1, 3, 3, 5], [0, 1, 3, 4, 5], [0, 1, 3, 5, 5]]
    plain = StepBuilder()
    plain.add(0, 0, [1, 2], slots=[0, 1])
    assert plain.build().mrope_positions is None
    with pytest.raises(ValueError, match="M-RoPE"):
        StepBuilder().add(0, 0, [1], slots=[0], mrope_positions=[[0], [0]])


def test_tied_checkpoint(tmp_path: Path) -> None:
    """tie_word_embeddings at the top level (Qwen2.5-VL-3B): lm_head is the embedding table,
    stored or not; the tokens stay transformers'."""
    from safetensors import safe_open

    hf = make_tiny_qwen2vl(tmp_path, "qwen2_5_vl", seed=3, tied=True)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in set(f.keys())
    text = f"w5 {IMG} w6"
    image = png_bytes(16, SMALL)
    _, expected = hf_greedy(hf, tmp_path, text, [image], NEW)
    with _engine(tmp_path) as engine:
        assert _tokens(engine, text, [image])["output_ids"] == expected


def test_in_memory_checkpoint_names(tiny: tuple) -> None:
    """transformers 5's own parameter names (`model.language_model.*`, `model.visual.*`) load
    as the published ones (`model.*`, `visual.*`) do."""
    folder, hf = tiny
    names = [name for name, _ in hf.named_parameters()]
    assert any(n.startswith("model.language_model.") for n in names)
    assert any(n.startswith("model.visual.") for n in names)
    model = load_model(str(folder), dtype="float32").model
    for param in model.parameters():
        param.data.zero_()
    model.load_weights((n, t.detach().clone()) for n, t in hf.named_parameters())
    ours = dict(model.named_parameters())
    torch.testing.assert_close(
        ours["visual.merger.mlp.0.weight"], hf.model.visual.merger.mlp[0].weight
    )
    torch.testing.assert_close(
        ours["model.embed_tokens.weight"], hf.model.language_model.embed_tokens.weight
    )


def test_speculative_decoding_is_refused(tiny: tuple) -> None:
    """Speculative steps rotate by 1-D positions: refused at start, naming the option."""
    folder, _ = tiny
    with pytest.raises(ValueError, match="--speculative-algorithm"):
        _engine(folder, speculative_algorithm="NGRAM")


def test_pipeline_parallel_is_refused(tiny: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pipeline runs stage bodies past the image features and M-RoPE positions."""
    from radixserve.distributed import parallel_state
    from radixserve.models.config import ModelConfig
    from radixserve.models.qwen2_vl import Qwen2VLForConditionalGeneration

    folder, _ = tiny
    config = ModelConfig.from_pretrained(str(folder))
    monkeypatch.setattr(parallel_state, "get_pp_size", lambda: 2)
    with pytest.raises(ValueError, match="--pp-size 1 only"):
        Qwen2VLForConditionalGeneration(config)


def test_retraction_keeps_transformers_tokens(tiny: tuple) -> None:
    """A KV pool too small for every request at once: requests with images are retracted and
    re-prefilled (their generated tokens at index + delta on every axis) and still end with
    transformers' tokens."""
    folder, hf = tiny
    long = 24
    cases = [(f"w{5 + i} {IMG} w{30 + i} w{40 + i}", [png_bytes(20 + i, SMALL)]) for i in range(4)]
    expected = [hf_greedy(hf, folder, text, imgs, long)[1] for text, imgs in cases]
    with _engine(folder, max_total_tokens=128, page_size=4) as engine:
        outs = engine.generate(
            input_ids=[_ids(text) for text, _ in cases],
            image_data=[[data_url(b) for b in imgs] for _, imgs in cases],
            sampling_params={**GREEDY, "max_new_tokens": long},
        )
    assert [o["output_ids"] for o in outs] == expected
    assert sum(o["meta_info"]["num_retractions"] for o in outs) > 0


def test_prefill_steps_stay_within_the_scratch_rows() -> None:
    """An M-RoPE model's prefill budgets are capped at the context length (the rotary table's
    scratch rows); budgets within it are kept."""
    from radixserve.managers.image_chunking import mrope_step_limits

    assert mrope_step_limits(16384, None, 4096) == (4096, None)
    assert mrope_step_limits(16384, 8192, 4096) == (4096, 4096)
    assert mrope_step_limits(2048, 512, 4096) == (2048, 512)
