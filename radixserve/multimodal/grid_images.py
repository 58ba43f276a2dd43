"""API side, for models whose processor picks each image's resolution (Qwen2-VL, Qwen2.5-VL):
the model folder's image processor (Qwen2VLImageProcessor) resizes an image to a multiple of
patch x merge pixels within its pixel budget and gives its flattened patches and patch grid
(t, h, w); the image becomes t * h * w / merge^2 `<|image_pad|>` tokens, as transformers'
Qwen2VLProcessor writes it. The chat template writes one pad token per image between
`<|vision_start|>` and `<|vision_end|>`; that token is repeated in place. The processor is
loaded from the model folder only, never fetched."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from radixserve.errors import InvalidRequestError
from radixserve.messages import ImageInput
from radixserve.multimodal.folder_processor import FolderImageProcessor
from radixserve.multimodal.image_prompt import ImagePrompt, token_runs
from radixserve.multimodal.image_source import LoadedImage


class GridImages(FolderImageProcessor):
    """The model folder's image processor, loaded on the first image (FolderImageProcessor)."""

    def expand(
        self, ids: list[int], prompt: ImagePrompt, images: Sequence[LoadedImage]
    ) -> tuple[list[int], list[ImageInput]]:
        """`ids` with each image's pad token (one per image, in order) repeated to the image's
        token count, and each image's patches, grid and span; a prompt already expanded (the
        processor's output: one run of the right length per image) is kept. Raises
        InvalidRequestError (a 400) for a count that does not match or an image the processor
        refuses."""
        runs = token_runs(ids, prompt.token_id)
        if len(runs) != len(images):  # checked before any image is processed
            raise InvalidRequestError(
                f"The prompt has {len(runs)} image placeholder(s) for {len(images)} image(s); "
                "write one image token per image.",
                "image_data",
            )
        processor = self._load()
        merge = prompt.tokens_per_image  # patches per token
        processed = [self._patches(processor, image, k) for k, image in enumerate(images)]
        counts = [t * h * w // merge for _, (t, h, w) in processed]
        expanded = all(length == n for (_, length), n in zip(runs, counts, strict=True))
        if not expanded and any(length != 1 for _, length in runs):
            raise InvalidRequestError(
                "The prompt's image token runs do not match its images' sizes; write one "
                "image token per image.",
                "image_data",
            )
        out: list[int] = []
        inputs: list[ImageInput] = []
        pos = 0
        for (at, length), image, (pixels, grid), n in zip(
            runs, images, processed, counts, strict=True
        ):
            out.extend(ids[pos:at])
            inputs.append(ImageInput(image.data, image.hash, len(out), n, pixels, grid_thw=grid))
            out.extend([prompt.token_id] * n)
            pos = at + length
        out.extend(ids[pos:])
        return out, inputs

    @staticmethod
    def _patches(processor: Any, image: LoadedImage, k: int) -> tuple[Any, tuple[int, int, int]]:
        """(flattened patches [t*h*w, patch features] float32 as a numpy array: it pickles to
        the scheduler without torch, the grid (t, h, w))."""
        import numpy as np
        from PIL import Image

        try:
            with Image.open(io.BytesIO(image.data)) as opened:
                rgb = opened.convert("RGB")
            out = processor(images=[rgb], return_tensors="np")
        except Exception as exc:  # a file the decode check let through
            raise InvalidRequestError(
                f"Image {k} could not be processed: {exc}", "image_data"
            ) from exc
        t, h, w = (int(x) for x in out["image_grid_thw"][0])
        pixels = np.ascontiguousarray(out["pixel_values"], dtype=np.float32)
        return pixels, (t, h, w)
