"""API side, for models whose processor decides how many tokens an image becomes (Idefics3,
SmolVLM): the model folder's image processor splits each image into tiles plus a global view
and gives their pixel values; each `<image>` placeholder of the prompt becomes the processor's
text for that image,

    <fake_token_around_image><row_1_col_1><image>*n ... "\\n" per row of tiles,
    "\\n"<fake_token_around_image><global-img><image>*n<fake_token_around_image>

(only the global part for an image that was not split), tokenized by the folder's tokenizer and
spliced in, so the tokens equal what transformers' Idefics3Processor / SmolVLMProcessor give
for the whole text (the text starts and ends with special tokens, so nothing around it merges
with it). Both are loaded from the model folder only, never fetched."""

from __future__ import annotations

import io
import threading
from collections.abc import Sequence
from typing import Any

from radixserve.errors import InvalidRequestError
from radixserve.messages import ImageInput
from radixserve.multimodal.image_prompt import ImagePrompt
from radixserve.multimodal.image_source import LoadedImage

FAKE_TOKEN = "<fake_token_around_image>"
IMAGE_TOKEN = "<image>"
GLOBAL_TOKEN = "<global-img>"


def image_text(rows: int, cols: int, seq_len: int) -> str:
    """The processor's text for an image cut into rows x cols tiles (0 x 0: not cut)."""
    tile = IMAGE_TOKEN * seq_len
    whole = f"{FAKE_TOKEN}{GLOBAL_TOKEN}{tile}{FAKE_TOKEN}"
    if rows == 0 and cols == 0:
        return whole
    grid = "".join(
        "".join(f"{FAKE_TOKEN}<row_{r + 1}_col_{c + 1}>{tile}" for c in range(cols)) + "\n"
        for r in range(rows)
    )
    return f"{grid}\n{whole}"


class TiledImages:
    """The model folder's image processor and tokenizer, loaded on the first image."""

    def __init__(self, model_dir: str) -> None:
        self.model_dir = model_dir
        self._loaded: tuple[Any, Any] | None = None
        self._lock = threading.Lock()

    def _load(self) -> tuple[Any, Any]:
        with self._lock:
            if self._loaded is None:
                from transformers import AutoImageProcessor, AutoTokenizer

                self._loaded = (
                    AutoImageProcessor.from_pretrained(self.model_dir, local_files_only=True),
                    AutoTokenizer.from_pretrained(self.model_dir, local_files_only=True),
                )
            return self._loaded

    def expand(
        self, ids: list[int], prompt: ImagePrompt, images: Sequence[LoadedImage]
    ) -> tuple[list[int], list[ImageInput]]:
        """`ids` with each image's placeholder (one per image, in order) replaced by the
        processor's tokens for it, and each image's pixels and span; raises
        InvalidRequestError (a 400) for a placeholder count that does not match or an image
        the processor refuses."""
        found = [i for i, tok in enumerate(ids) if tok == prompt.token_id]
        if len(found) != len(images):
            raise InvalidRequestError(
                f"The prompt has {len(found)} image placeholder token(s) for {len(images)} "
                "image(s); write one image token per image.",
                "image_data",
            )
        processor, tokenizer = self._load()
        out: list[int] = []
        inputs: list[ImageInput] = []
        pos = 0
        for k, (at, image) in enumerate(zip(found, images, strict=True)):
            pixels, mask, rows, cols = self._pixels(processor, image, k)
            tokens = list(
                tokenizer.encode(
                    image_text(rows, cols, prompt.tokens_per_image), add_special_tokens=False
                )
            )
            tiles = pixels.shape[0]
            if tokens.count(prompt.token_id) != tiles * prompt.tokens_per_image:
                # A tokenizer without the markers, or a processor whose tiles disagree.
                raise InvalidRequestError(
                    f"Image {k} became {tokens.count(prompt.token_id)} image tokens for "
                    f"{tiles} tile(s) of {prompt.tokens_per_image}.",
                    "image_data",
                )
            out.extend(ids[pos:at])
            inputs.append(ImageInput(image.data, image.hash, len(out), len(tokens), pixels, mask))
            out.extend(tokens)
            pos = at + 1
        out.extend(ids[pos:])
        return out, inputs

    @staticmethod
    def _pixels(processor: Any, image: LoadedImage, k: int) -> tuple[Any, Any, int, int]:
        """(pixel values [tiles, 3, S, S] float32, pixel mask [tiles, S, S] or None, rows,
        cols) as numpy arrays: they pickle to the scheduler without torch."""
        import numpy as np
        from PIL import Image

        try:
            with Image.open(io.BytesIO(image.data)) as opened:
                rgb = opened.convert("RGB")
            out = processor(images=[[rgb]], return_row_col_info=True, return_tensors="np")
        except Exception as exc:  # a file the decode check let through
            raise InvalidRequestError(
                f"Image {k} could not be processed: {exc}", "image_data"
            ) from exc
        pixels = np.ascontiguousarray(out["pixel_values"][0], dtype=np.float32)
        mask = out.get("pixel_attention_mask")
        mask = None if mask is None else np.ascontiguousarray(mask[0], dtype=np.bool_)
        return pixels, mask, int(out["rows"][0][0]), int(out["cols"][0][0])
