"""How a vision model's prompt holds an image: one placeholder token per image feature.

A picklable description (ImagePrompt) travels in SchedulerReady from the loaded model to the API
side, which expands each placeholder the prompt has (the chat template writes one per image,
`<image>`): under the "fixed" layout into `tokens_per_image` copies, as transformers'
LlavaProcessor does with the text; under the "tiles" layout (Idefics3, SmolVLM) the model
folder's processor decides, image by image (multimodal/tiled_images.py); under "anyres"
(LLaVA-OneVision, LLaVA-NeXT) into as many copies as the image's crops give features, which
depends on its size (multimodal/anyres_images.py); under the "grid" layout (Qwen2-VL) the
processor picks each image's resolution and so its count of placeholder tokens, its merged
patch grid (multimodal/grid_images.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from radixserve.errors import InvalidRequestError

# Cache keys of image tokens live in [2**31, 2**32): above every vocabulary, below the LoRA
# namespace stride (mem_cache/namespace.py adds multiples of 2**32).
IMAGE_KEY_BASE = 1 << 31
LAYOUTS = ("fixed", "tiles", "anyres", "grid")


@dataclass(frozen=True)
class ImagePrompt:
    """A vision model's placeholder: its token id and how many features an image becomes
    ("fixed"), or one tile of it becomes ("tiles": the processor picks the tiles), or one
    crop of it becomes ("anyres": a square grid of them; the image's size picks the crops), or
    how many patches merge into one feature ("grid": the processor picks the patch grid).

    A model whose features take a token of their own, framed by others (Gemma 3: the template
    writes `<start_of_image>`, which Gemma3Processor turns into "\n\n", `<start_of_image>`,
    256 `<image_soft_token>`s, `<end_of_image>`, "\n\n") sets `feature_token_id` and the
    frame's token ids `before` and `after`; the image's span then covers the feature tokens."""

    token_id: int
    tokens_per_image: int
    layout: str = "fixed"
    feature_token_id: int | None = None
    before: tuple[int, ...] = ()
    after: tuple[int, ...] = ()
    # "anyres": OneVision's anyres_max_N (a large image's grid shrinks to about N crops'
    # worth of features; several images are one crop each); None (NeXT): neither.
    anyres_max: int | None = None


@dataclass(frozen=True)
class ImageSpan:
    """Where an image's placeholder tokens sit in the expanded prompt."""

    offset: int
    length: int


def expand_placeholders(
    ids: Sequence[int], prompt: ImagePrompt, num_images: int
) -> tuple[list[int], list[ImageSpan]]:
    """`ids` with each placeholder token (one per image, in order) expanded to one per image
    feature, and where each image's tokens went. A prompt already expanded (tokens_per_image
    placeholders in a row per image) is kept as it is. Raises InvalidRequestError when the
    placeholders and the images disagree."""
    if prompt.feature_token_id is not None:
        return _expand_framed(ids, prompt, num_images)
    n = prompt.tokens_per_image
    found = [i for i, tok in enumerate(ids) if tok == prompt.token_id]
    if len(found) == num_images:
        out: list[int] = []
        spans: list[ImageSpan] = []
        pos = 0
        for at in found:
            out.extend(ids[pos:at])
            spans.append(ImageSpan(len(out), n))
            out.extend([prompt.token_id] * n)
            pos = at + 1
        out.extend(ids[pos:])
        return out, spans
    blocks = [found[k : k + n] for k in range(0, len(found), n)]
    if len(found) == num_images * n and all(b[-1] - b[0] == n - 1 for b in blocks):
        return list(ids), [ImageSpan(b[0], n) for b in blocks]
    raise InvalidRequestError(
        f"The prompt has {len(found)} image placeholder token(s) for {num_images} image(s); "
        "write one image token per image.",
        "image_data",
    )


def _expand_framed(
    ids: Sequence[int], prompt: ImagePrompt, num_images: int
) -> tuple[list[int], list[ImageSpan]]:
    """expand_placeholders for a prompt with a feature token: each placeholder becomes
    `before`, tokens_per_image feature tokens, `after`; a prompt that already holds
    tokens_per_image feature tokens in a row per image (the processor's output) is kept."""
    n, feature = prompt.tokens_per_image, prompt.feature_token_id
    assert feature is not None
    runs = [i for i, tok in enumerate(ids) if tok == feature and (i == 0 or ids[i - 1] != feature)]
    if runs and len(runs) == num_images and all(_run_length(ids, at, feature) == n for at in runs):
        return list(ids), [ImageSpan(at, n) for at in runs]
    found = [i for i, tok in enumerate(ids) if tok == prompt.token_id]
    if not runs and len(found) == num_images:
        out: list[int] = []
        spans: list[ImageSpan] = []
        pos = 0
        for at in found:
            out.extend(ids[pos:at])
            out.extend(prompt.before)
            spans.append(ImageSpan(len(out), n))
            out.extend([feature] * n)
            out.extend(prompt.after)
            pos = at + 1
        out.extend(ids[pos:])
        return out, spans
    raise InvalidRequestError(
        f"The prompt has {len(found)} image placeholder token(s) and {len(runs)} run(s) of "
        f"image feature tokens for {num_images} image(s); write one image token per image.",
        "image_data",
    )


def token_runs(ids: Sequence[int], token: int) -> list[tuple[int, int]]:
    """(start, length) of each run of `token` in `ids`: where a prompt's expanded images are."""
    runs: list[tuple[int, int]] = []
    for i, tok in enumerate(ids):
        if tok != token:
            continue
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


def _run_length(ids: Sequence[int], at: int, token: int) -> int:
    end = at
    while end < len(ids) and ids[end] == token:
        end += 1
    return end - at


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
