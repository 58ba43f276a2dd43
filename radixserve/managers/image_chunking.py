"""Prefill chunks that keep images whole, for models whose image tokens attend to each other
both ways (Gemma 3): a chunk ending inside an image would run its first tokens without seeing
the rest. SGLang keeps such images in one chunk likewise. Also the step limits of a model
whose rotary table has a bounded number of rows for a step's image tokens (M-RoPE)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

logger = logging.getLogger(__name__)


class ImageSpanLike(Protocol):
    """Where an image's tokens sit in the prompt (multimodal/image_items.ImageItem)."""

    offset: int
    end: int


def whole_image_take(
    images: Sequence[ImageSpanLike],
    first: int,
    take: int,
    extend_len: int,
    page_size: int,
    grow: bool,
) -> int:
    """How many of the tokens from `first` on (`take` planned, `extend_len` left) one step runs
    so that it ends inside no image: cut back to the image's start (on a page boundary), or,
    where that leaves nothing and `grow` (the batch has no other request), run on past the image
    (a little over the chunk budget: --chunked-prefill-size is at least an image, so only page
    rounding needs it). 0: the request waits for a step with more room."""
    if take >= extend_len:
        return take
    end = first + take
    while (cut := _inside(images, end)) is not None:
        end = first + (cut[0] - first) // page_size * page_size
    if end > first or not grow:
        return end - first
    end = first + take
    while (span := _inside(images, end)) is not None:
        end = min(first + -(-(span[1] - first) // page_size) * page_size, first + extend_len)
    return end - first


def _inside(images: Sequence[ImageSpanLike], pos: int) -> tuple[int, int] | None:
    """(offset, end) of the image that `pos` falls strictly inside, or None."""
    for image in images:
        if image.offset < pos < image.end:
            return image.offset, image.end
    return None


def check_chunk_size(chunk_size: int | None, tokens_per_image: int) -> None:
    """Refuse a --chunked-prefill-size under one image of a model that keeps images whole."""
    if chunk_size is not None and chunk_size < tokens_per_image:
        raise ValueError(
            f"--chunked-prefill-size {chunk_size} is smaller than one image of this model "
            f"({tokens_per_image} tokens), whose image tokens attend to each other and must run "
            f"in one prefill step; set it to at least {tokens_per_image} (or -1: no chunking)"
        )


def mrope_step_limits(
    max_prefill_tokens: int, chunk_size: int | None, context_len: int
) -> tuple[int, int | None]:
    """--max-prefill-tokens and --chunked-prefill-size capped at the context length, for an
    M-RoPE model whose rotary table holds one scratch row per image token of a step: a prefill
    step then never holds more tokens than that (its first request is at most one context)."""
    capped = min(max_prefill_tokens, context_len)
    chunk = None if chunk_size is None else min(chunk_size, context_len)
    if capped != max_prefill_tokens or chunk != chunk_size:
        logger.info(
            "M-RoPE model: a prefill step holds at most %d tokens (the context length)",
            context_len,
        )
    return capped, chunk
