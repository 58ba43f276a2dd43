"""API side, for LLaVA-OneVision and LLaVA-NeXT ("anyres" layout): the model folder's image
processor resizes an image onto the best of its `image_grid_pinpoints`, cuts that into rows x
cols crops and adds the whole image as a base crop; the model turns the crops into one feature
grid, cropped back to the image's aspect ratio, with a newline feature after each row. So an
image's token count depends on its size: each `<image>` placeholder becomes that many `<image>`
tokens, the count transformers' processors give (their _get_number_of_features).

OneVision's processor crops only a request's single image: with several images each becomes one
square-padded crop (its base features and one newline), as LlavaOnevisionProcessor does for a
sample of several images. NeXT crops every image. Both are loaded from the model folder only.
"""

from __future__ import annotations

import dataclasses
import io
import math
from collections.abc import Sequence
from typing import Any

from radixserve.errors import InvalidRequestError
from radixserve.messages import ImageInput
from radixserve.multimodal.folder_processor import FolderImageProcessor
from radixserve.multimodal.image_prompt import ImagePrompt, token_runs
from radixserve.multimodal.image_source import LoadedImage

# Mixed into a OneVision image's hash when it is one of several (base crop only): the same
# bytes then give other features and tokens, which must not share a cached prefix or entry.
_SINGLE_CROP_SALT = 0x9E3779B97F4A7C15


def best_resolution(height: int, width: int, pinpoints: Sequence[Sequence[int]]) -> tuple[int, int]:
    """The (height, width) of `pinpoints` that keeps most of the image's pixels once it is
    scaled to fit, then wastes the least area: the processors' choice."""
    best: tuple[int, int] | None = None
    most, least_waste = 0, math.inf
    for h, w in pinpoints:
        scale = min(w / width, h / height)
        kept = min(int(width * scale) * int(height * scale), width * height)
        waste = h * w - kept
        if kept > most or (kept == most and waste < least_waste):
            best, most, least_waste = (int(h), int(w)), kept, waste
    if best is None:
        raise ValueError("image_grid_pinpoints is empty")
    return best


def unpadded_grid(height: int, width: int, rows: int, cols: int, side: int) -> tuple[int, int]:
    """The feature grid of rows x cols crops of side x side features each, less the rows or
    columns that only the padding to the crops' aspect ratio filled."""
    grid_h, grid_w = rows * side, cols * side
    if width / height > grid_w / grid_h:
        new_h = int(round(height * (grid_w / width), 7))
        grid_h -= ((grid_h - new_h) // 2) * 2
    else:
        new_w = int(round(width * (grid_h / height), 7))
        grid_w -= ((grid_w - new_w) // 2) * 2
    return grid_h, grid_w


def shrunk_grid(grid_h: int, grid_w: int, side: int, max_crops: int | None) -> tuple[int, int]:
    """OneVision's "anyres_max_N": a grid over N crops' worth of features (by more than 10%)
    is scaled down to about N crops' worth; None (NeXT) keeps it."""
    if max_crops is None:
        return grid_h, grid_w
    ratio = math.sqrt(grid_h * grid_w / (max_crops * side * side))
    if ratio <= 1.1:
        return grid_h, grid_w
    return int(grid_h // ratio), int(grid_w // ratio)


def anyres_feature_count(height: int, width: int, rows: int, cols: int, prompt: ImagePrompt) -> int:
    """Features of an image of height x width cut into rows x cols crops: the base crop's,
    then the unpadded grid's with one newline per grid row."""
    side = math.isqrt(prompt.tokens_per_image)
    grid_h, grid_w = unpadded_grid(height, width, rows, cols, side)
    grid_h, grid_w = shrunk_grid(grid_h, grid_w, side, prompt.anyres_max)
    return prompt.tokens_per_image + grid_h * grid_w + grid_h


class AnyresImages(FolderImageProcessor):
    """The model folder's image processor, loaded on the first image (FolderImageProcessor)."""

    def expand(
        self, ids: list[int], prompt: ImagePrompt, images: Sequence[LoadedImage]
    ) -> tuple[list[int], list[ImageInput]]:
        """`ids` with each image's placeholder (one per image, in order) repeated as many times
        as the image has features, and each image's crops, size and span. A prompt already
        expanded (a run of exactly that many image tokens per image: the processor's ids) is
        kept. Raises InvalidRequestError (a 400) for placeholders that do not match the images
        or an image the processor refuses."""
        found = [i for i, tok in enumerate(ids) if tok == prompt.token_id]
        if not images:
            if found:
                raise _mismatch(len(found), 0)
            return list(ids), []
        runs = token_runs(ids, prompt.token_id)
        if len(found) != len(images) and len(runs) != len(images):
            raise _mismatch(len(found), len(images))
        processed = self._process(prompt, images)
        if len(found) != len(images):
            # Already expanded: each run must hold its image's features exactly.
            if [length for _, length in runs] != [p.length for p in processed]:
                raise _mismatch(len(found), len(images))
            starts = [at for at, _ in runs]
            return list(ids), [
                dataclasses.replace(p, offset=at) for p, at in zip(processed, starts, strict=True)
            ]
        out: list[int] = []
        inputs: list[ImageInput] = []
        pos = 0
        for at, image in zip(found, processed, strict=True):
            out.extend(ids[pos:at])
            inputs.append(dataclasses.replace(image, offset=len(out)))
            out.extend([prompt.token_id] * image.length)
            pos = at + 1
        out.extend(ids[pos:])
        return out, inputs

    def _process(self, prompt: ImagePrompt, images: Sequence[LoadedImage]) -> list[ImageInput]:
        """Each image's crops, feature count, size and grid (offsets still 0)."""
        processor = self._load()
        # OneVision: one image is cropped, several are one crop each (the processor's rule).
        single_crop = prompt.anyres_max is not None and len(images) > 1
        pixels, sizes = self._pixels(processor, images, single_crop)
        out = []
        for k, image in enumerate(images):
            crops = pixels[k]
            if single_crop:
                crops = crops[:1]
                count = prompt.tokens_per_image + 1  # the base crop and one newline
                grid = None
                image_hash = (image.hash ^ _SINGLE_CROP_SALT) & ((1 << 64) - 1)
            else:
                height, width = sizes[k]
                rows, cols = self._grid(processor, height, width, crops.shape[-1])
                if crops.shape[0] < rows * cols + 1:
                    raise InvalidRequestError(
                        f"Image {k} was cut into {crops.shape[0]} crops, not the "
                        f"{rows} x {cols} + 1 its size asks for.",
                        "image_data",
                    )
                crops = crops[: rows * cols + 1]  # the processor pads a batch's crop counts
                count = anyres_feature_count(height, width, rows, cols, prompt)
                grid = (height, width, rows, cols)
                image_hash = image.hash
            out.append(ImageInput(image.data, image_hash, 0, count, crops, None, grid))
        return out

    @staticmethod
    def _grid(processor: Any, height: int, width: int, crop: int) -> tuple[int, int]:
        pinpoints = getattr(processor, "image_grid_pinpoints", None)
        if not pinpoints:
            raise InvalidRequestError(
                "The model folder's image processor has no image_grid_pinpoints.", "image_data"
            )
        best_h, best_w = best_resolution(height, width, pinpoints)
        return best_h // crop, best_w // crop

    @staticmethod
    def _pixels(
        processor: Any, images: Sequence[LoadedImage], single_crop: bool
    ) -> tuple[list[Any], list[tuple[int, int]]]:
        """Each image's crops [crops, 3, S, S] (numpy float32: they pickle to the scheduler
        without torch) and its (height, width)."""
        import numpy as np
        from PIL import Image

        rgb = []
        for k, image in enumerate(images):
            try:
                with Image.open(io.BytesIO(image.data)) as opened:
                    rgb.append(opened.convert("RGB"))
            except Exception as exc:  # a file the decode check let through
                raise InvalidRequestError(
                    f"Image {k} could not be processed: {exc}", "image_data"
                ) from exc
        try:
            if single_crop:
                out = processor(images=[rgb], return_tensors="np")
            else:
                out = [processor(images=[im], return_tensors="np") for im in rgb]
        except Exception as exc:
            raise InvalidRequestError(
                f"The images could not be processed: {exc}", "image_data"
            ) from exc
        if single_crop:
            pixels = [np.ascontiguousarray(p, dtype=np.float32) for p in out["pixel_values"]]
            sizes = [(int(h), int(w)) for h, w in out["image_sizes"]]
        else:
            pixels = [np.ascontiguousarray(o["pixel_values"][0], dtype=np.float32) for o in out]
            sizes = [(int(o["image_sizes"][0][0]), int(o["image_sizes"][0][1])) for o in out]
        return pixels, sizes


def _mismatch(found: int, images: int) -> InvalidRequestError:
    return InvalidRequestError(
        f"The prompt has {found} image placeholder token(s) for {images} image(s); write one "
        "image token per image.",
        "image_data",
    )
