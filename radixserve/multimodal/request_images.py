"""API side: a request's `image_data` -> checked images and the prompt with each image's
placeholder expanded (multimodal/image_prompt.py), or a 400 naming what is wrong."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from radixserve.errors import InvalidRequestError
from radixserve.messages import ImageInput
from radixserve.multimodal.anyres_images import AnyresImages
from radixserve.multimodal.grid_images import GridImages
from radixserve.multimodal.image_prompt import ImagePrompt, expand_placeholders
from radixserve.multimodal.image_source import load_image
from radixserve.multimodal.media_fetch import MediaFetchPolicy
from radixserve.multimodal.tiled_images import TiledImages

# SGLang's image_data: for one prompt an image or a list of images; for a batch a list with one
# entry (None, an image or a list of images) per prompt. An image is a string: a data URL,
# base64, a local path or an http(s) URL.
ImageData = str | Sequence[str | Sequence[str] | None] | None


def per_prompt_images(image_data: ImageData, count: int) -> list[list[str] | None]:
    """Each prompt's images (None: no images) of `count` prompts. None, "" and [] are unset
    (the defaults a client may send back)."""
    if image_data is None or len(image_data) == 0:
        return [None] * count
    if isinstance(image_data, str):
        if count != 1:
            raise InvalidRequestError(
                "image_data for a batch must be a list with one entry per prompt.", "image_data"
            )
        return [[image_data]]
    entries = list(image_data)
    if count == 1 and all(isinstance(e, str) for e in entries):
        return [list(entries)] if entries else [None]  # type: ignore[list-item]
    if len(entries) != count:
        raise InvalidRequestError(
            f"image_data has {len(entries)} entries for {count} prompts.", "image_data"
        )
    out: list[list[str] | None] = []
    for entry in entries:
        if entry is None or isinstance(entry, str):
            out.append(None if entry is None else [entry])
        elif isinstance(entry, list | tuple):
            out.append(list(entry) or None)
        else:
            raise InvalidRequestError(
                "Each image_data entry must be a string or a list of strings.", "image_data"
            )
    return out


def image_limit(value: Any) -> int | None:
    """--limit-mm-data-per-request's image count (SGLang's JSON, e.g. {"image": 2}), or None."""
    if value is None or value == "":
        return None
    limits = json.loads(value) if isinstance(value, str) else value
    if not isinstance(limits, dict):
        raise ValueError('--limit-mm-data-per-request must be a JSON object, e.g. {"image": 2}')
    image = limits.get("image")
    if image is None:
        return None
    if isinstance(image, bool) or not isinstance(image, int) or image < 0:
        raise ValueError("--limit-mm-data-per-request's image limit must be an integer >= 0")
    return image


class RequestImages:
    """What the API side knows about the model's images: its placeholder (None: a text-only
    model), the most images one request may carry (None: no limit), how http(s) image URLs
    are fetched (None: refused) and the model folder, whose processor expands the images of a
    "tiles", "anyres" or "grid" layout."""

    def __init__(
        self,
        prompt: ImagePrompt | None,
        limit: int | None = None,
        fetch: MediaFetchPolicy | None = None,
        model_dir: str | None = None,
    ) -> None:
        self.prompt = prompt
        self.limit = limit
        self.fetch = fetch
        # The processor that expands each image on this side (its count is the processor's).
        self.tiled: TiledImages | AnyresImages | None = None
        if prompt is not None and prompt.layout in ("tiles", "anyres"):
            if model_dir is None:
                raise ValueError("a model whose processor tiles images needs its model folder")
            self.tiled = (TiledImages if prompt.layout == "tiles" else AnyresImages)(model_dir)
        self.grid: GridImages | None = None
        if prompt is not None and prompt.layout == "grid":
            if model_dir is None:
                raise ValueError("a model whose processor sizes images needs its model folder")
            self.grid = GridImages(model_dir)

    @property
    def accepted(self) -> bool:
        return self.prompt is not None

    @property
    def sized_by_processor(self) -> bool:
        """Whether an image's token count is the processor's (read from the image)."""
        return self.tiled is not None or self.grid is not None

    def expand(
        self, ids: list[int], image_data: Sequence[str]
    ) -> tuple[list[int], list[ImageInput]]:
        if self.prompt is None:
            raise InvalidRequestError(
                "This model reads text only; it takes no images.", "image_data"
            )
        if self.limit is not None and len(image_data) > self.limit:
            raise InvalidRequestError(
                f"The request has {len(image_data)} images; this server takes at most "
                f"{self.limit} per request (--limit-mm-data-per-request).",
                "image_data",
            )
        # The count is checked above first, so a request over the limit fetches nothing.
        loaded = [
            load_image(src, f"image_data[{i}]", self.fetch) for i, src in enumerate(image_data)
        ]
        if self.tiled is not None:
            return self.tiled.expand(ids, self.prompt, loaded)
        if self.grid is not None:
            return self.grid.expand(ids, self.prompt, loaded)
        expanded, spans = expand_placeholders(ids, self.prompt, len(loaded))
        images = [
            ImageInput(im.data, im.hash, span.offset, span.length)
            for im, span in zip(loaded, spans, strict=True)
        ]
        return expanded, images
