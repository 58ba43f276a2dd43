"""Scheduler side: a request's images as the vision tower takes them.

The model folder's image processor (CLIPImageProcessor for LLaVA-1.5, loaded through
transformers' AutoImageProcessor on first use) turns each image's bytes into pixel values when
the request arrives; the vision tower turns them into features at the request's first prefill
step that reaches the image (models/llava.py), and the features are dropped once every
placeholder token of the image has been run, so only prefill holds them.
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
    """One image of a request: pixels [3, H, W], the content hash, where its placeholder tokens
    sit in the prompt, and its projected features [length, hidden] while prefill needs them."""

    pixel_values: torch.Tensor
    hash: int
    offset: int
    length: int
    features: torch.Tensor | None = None

    @property
    def end(self) -> int:
        return self.offset + self.length


class ImagePreprocessor:
    """The model folder's image processor, loaded on the first image."""

    def __init__(self, model_dir: str | Path, image_size: int) -> None:
        self.model_dir = str(model_dir)
        self.image_size = image_size  # what the vision tower's position table covers
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
        """Pixel values for each image; raises InvalidRequestError (the request's fault)."""
        if not images:
            return []
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
