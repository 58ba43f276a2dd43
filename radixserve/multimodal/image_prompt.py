"""How a vision model's prompt holds an image: one placeholder token per image feature.

A picklable description (ImagePrompt) travels in SchedulerReady from the loaded model to the API
side, which expands each placeholder the prompt has (the chat template writes one per image,
`<image>`) into `tokens_per_image` copies, as transformers' LlavaProcessor does with the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from radixserve.errors import InvalidRequestError

# Cache keys of image tokens live in [2**31, 2**32): above every vocabulary, below the LoRA
# namespace stride (mem_cache/namespace.py adds multiples of 2**32).
IMAGE_KEY_BASE = 1 << 31


@dataclass(frozen=True)
class ImagePrompt:
    """A vision model's placeholder: its token id and how many features an image becomes."""

    token_id: int
    tokens_per_image: int


@dataclass(frozen=True)
class ImageSpan:
    """Where an image's placeholder tokens sit in the expanded prompt."""

    offset: int
    length: int


def expand_placeholders(
    ids: Sequence[int], prompt: ImagePrompt, num_images: int
) -> tuple[list[int], list[ImageSpan]]:
    """`ids` with each single placeholder token expanded to one per image feature, and where
    each image's tokens went. A prompt already expanded (tokens_per_image in a row per image)
    is kept as it is. Raises InvalidRequestError when the placeholders and images disagree."""
    runs = _placeholder_runs(ids, prompt.token_id)
    if len(runs) != num_images:
        raise InvalidRequestError(
            f"The prompt has {len(runs)} image placeholder(s) but the request gives "
            f"{num_images} image(s); write one image token per image.",
            "image_data",
        )
    out: list[int] = []
    spans: list[ImageSpan] = []
    pos = 0
    for start, length in runs:
        out.extend(ids[pos:start])
        if length not in (1, prompt.tokens_per_image):
            raise InvalidRequestError(
                f"An image placeholder run has {length} tokens; expected 1 or "
                f"{prompt.tokens_per_image}.",
                "image_data",
            )
        spans.append(ImageSpan(len(out), prompt.tokens_per_image))
        out.extend([prompt.token_id] * prompt.tokens_per_image)
        pos = start + length
    out.extend(ids[pos:])
    return out, spans


def _placeholder_runs(ids: Sequence[int], token_id: int) -> list[tuple[int, int]]:
    """(start, length) of each maximal run of `token_id` in `ids`."""
    runs: list[tuple[int, int]] = []
    i = 0
    while i < len(ids):
        if ids[i] != token_id:
            i += 1
            continue
        start = i
        while i < len(ids) and ids[i] == token_id:
            i += 1
        runs.append((start, i - start))
    return runs


def image_key(image_hash: int) -> int:
    """The cache-key value that stands for every placeholder token of an image: derived from
    the image's content hash, so a repeated image shares a cached prefix and another image,
    whose placeholder token ids are the same, does not."""
    return IMAGE_KEY_BASE + image_hash % IMAGE_KEY_BASE


def keyed_ids(ids: list[int], spans: Sequence[tuple[int, int, int]]) -> list[int]:
    """`ids` with each image's tokens replaced by its key; spans are (offset, length, hash)."""
    if not spans:
        return ids
    out = list(ids)
    for offset, length, image_hash in spans:
        out[offset : offset + length] = [image_key(image_hash)] * length
    return out
