"""Scheduler side: a request's images as the vision tower takes them.

The model folder's image processor (CLIPImageProcessor for LLaVA-1.5, loaded through
transformers' AutoImageProcessor on first use) turns each image's bytes into pixel values when
the request arrives; the vision tower turns them into features at the request's first prefill
step that reaches the image (models/llava.py), and the features are dropped once every
placeholder token of the image has been run, so only prefill holds them.

An image whose processor tiles it (Idefics3, SmolVLM) arrives processed by the API side
(multimodal/tiled_images.py); its span mixes marker tokens (`<fake_token_around_image>`,
`<row_1_col_1>`, "\n") with its image tokens, so the item records which span positions take
which feature (`slots`); the markers keep their text embeddings. An image an "anyres" processor
cropped (LLaVA-OneVision, LLaVA-NeXT; multimodal/anyres_images.py) arrives processed likewise,
its span all image tokens, with its size and crop grid (`anyres`) for the model's packing.

An image whose processor picks its resolution (Qwen2-VL, Qwen2.5-VL: the "grid" layout) also
arrives processed: its flattened patches [patches, channels x temporal x patch x patch] and its
patch grid (t, h, w), whose merged size is the number of its tokens.
"""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from radixserve.errors import InvalidRequestError
from radixserve.messages import ImageInput

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class ImageItem:
    """One image of a request: pixels ([3, H, W], or [tiles, 3, S, S] for a tiled image), the
    content hash, where its tokens sit in the prompt, and its projected features
    [feature_count, hidden] while prefill needs them. `slots` (None: every token of the span
    is an image token) gives each span position's feature index, -1 for a marker token;
    `pixel_mask` [tiles, S, S] marks a tile's real pixels (None: all are). `anyres` is a
    cropped image's (height, width, grid rows, grid cols) (multimodal/anyres_images.py).
    `grid_thw` is a "grid" image's patch grid (its pixel_values then [patches, features])."""

    pixel_values: torch.Tensor
    hash: int
    offset: int
    length: int
    features: torch.Tensor | None = None
    pixel_mask: torch.Tensor | None = None
    slots: torch.Tensor | None = None
    anyres: tuple[int, int, int, int] | None = None
    grid_thw: tuple[int, int, int] | None = None

    @property
    def end(self) -> int:
        return self.offset + self.length

    @property
    def feature_count(self) -> int:
        return self.length if self.slots is None else int((self.slots >= 0).sum())


def image_slots(span_ids: Sequence[int], token_id: int) -> torch.Tensor | None:
    """Each span position's feature index (-1: not an image token); None when every position
    is an image token."""
    is_image = torch.tensor([tok == token_id for tok in span_ids], dtype=torch.bool)
    if bool(is_image.all()):
        return None
    return torch.where(is_image, torch.cumsum(is_image, 0) - 1, -1)


class ImagePreprocessor:
    """The model folder's image processor, loaded on the first image."""

    def __init__(
        self,
        model_dir: str | Path,
        image_size: int,
        token_id: int = -1,
        tiled: bool = False,
        merge_size: int = 0,
    ) -> None:
        self.model_dir = str(model_dir)
        self.image_size = image_size  # what the vision tower's position table covers
        self.token_id = token_id  # the image token, among a tiled image's markers
        # The API side processes (tiles) every image of such a model; none is processed here.
        self.tiled = tiled or merge_size > 0
        # A "grid" model's patch merge (its images' token count is the grid over merge^2).
        self.merge_size = merge_size
        self._processor: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        with self._lock:
            if self._processor is None:
                from transformers import AutoImageProcessor

                self._processor = AutoImageProcessor.from_pretrained(self.model_dir)
                if getattr(self._processor, "do_pan_and_scan", False):
                    # Gemma 3's extra crops: the prompt holds one image's tokens per image.
                    logger.warning("do_pan_and_scan is not supported; each image is one crop")
                    self._processor.do_pan_and_scan = False
            return self._processor

    def prepare(self, images: Sequence[ImageInput]) -> list[ImageItem]:
        """Pixel values for each image (processed here, or taken as the API side processed
        them); raises InvalidRequestError (the request's fault)."""
        if not images:
            return []
        if self.tiled:
            return [self._processed(i, image) for i, image in enumerate(images)]
        from PIL import Image

        processor = self._load()
        items = []
        for i, image in enumerate(images):
            try:
                with Image.open(io.BytesIO(image.data)) as opened:
                    rgb = opened.convert("RGB")
                pixels = processor(images=rgb, return_tensors="pt")["pixel_values"][0]
            except Exception as exc:  # a file the API side's check let through
                raise InvalidRequestError(
                    f"Image {i} could not be processed: {exc}", "image_data"
                ) from exc
            if tuple(pixels.shape[-2:]) != (self.image_size, self.image_size):
                raise InvalidRequestError(
                    f"Image {i} was processed to {tuple(pixels.shape)}, but the vision tower "
                    f"takes {self.image_size}x{self.image_size} pixels.",
                    "image_data",
                )
            items.append(ImageItem(pixels, image.hash, image.offset, image.length))
        return items

    def _processed(self, i: int, image: ImageInput) -> ImageItem:
        """The ImageItem of an image the API side processed (tiled); its slots are set once
        it meets its request's tokens (place_tiled)."""
        if image.pixel_values is None:
            raise InvalidRequestError(
                f"Image {i} reached the scheduler without the processor's tiles.", "image_data"
            )
        pixels = torch.from_numpy(image.pixel_values)
        if self.merge_size:
            return self._grid_item(i, image, pixels)
        if pixels.ndim != 4 or tuple(pixels.shape[-2:]) != (self.image_size, self.image_size):
            raise InvalidRequestError(
                f"Image {i} was processed to tiles of {tuple(pixels.shape)}, but the vision "
                f"tower takes {self.image_size}x{self.image_size} pixels.",
                "image_data",
            )
        mask = None if image.pixel_mask is None else torch.from_numpy(image.pixel_mask)
        return ImageItem(
            pixels, image.hash, image.offset, image.length, None, mask, anyres=image.anyres
        )

    def _grid_item(self, i: int, image: ImageInput, pixels: torch.Tensor) -> ImageItem:
        """A "grid" image: its patches must fill its grid, and its span its merged grid."""
        grid = image.grid_thw
        m = self.merge_size
        if grid is None or len(grid) != 3 or pixels.ndim != 2:
            raise InvalidRequestError(
                f"Image {i} reached the scheduler without the processor's patches and grid.",
                "image_data",
            )
        t, h, w = (int(x) for x in grid)
        if t * h * w != pixels.shape[0] or h % m or w % m or t * h * w // (m * m) != image.length:
            raise InvalidRequestError(
                f"Image {i}'s grid {t}x{h}x{w} does not match its {pixels.shape[0]} patches "
                f"and {image.length} tokens (merge {m}).",
                "image_data",
            )
        return ImageItem(pixels, image.hash, image.offset, image.length, grid_thw=(t, h, w))

    def place_tiled(self, items: Sequence[ImageItem], ids: Sequence[int]) -> None:
        """Give each tiled image the feature slots of its span of the prompt `ids`."""
        if not self.tiled or self.merge_size:
            return
        for item in items:
            item.slots = image_slots(ids[item.offset : item.end], self.token_id)


@dataclass(frozen=True)
class ImageChunk:
    """Placeholder tokens of one image that one forward step runs: flattened batch rows
    [row, row + length) take the image's features [start, start + length). A chunked prefill
    (or a cached prefix ending inside the image) runs an image in several such pieces."""

    row: int
    image: ImageItem
    start: int
    length: int

    @property
    def completes_image(self) -> bool:
        return self.start + self.length == self.image.length


def image_chunks(images: Sequence[ImageItem], row: int, first: int, count: int) -> list[ImageChunk]:
    """The pieces of `images` among a request's tokens [first, first + count), which sit at
    flattened rows from `row` on."""
    chunks = []
    for image in images:
        lo, hi = max(first, image.offset), min(first + count, image.end)
        if lo < hi:
            chunks.append(ImageChunk(row + lo - first, image, lo - image.offset, hi - lo))
    return chunks
