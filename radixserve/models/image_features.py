"""A vision-language model's step: the image features that replace the embeddings of this
step's image tokens. Shared by LLaVA (models/llava.py) and Idefics3 / SmolVLM
(models/idefics3.py), which differ only in how they encode a list of images."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

import torch

from radixserve.models.vision_feature_cache import VisionFeatureCache

if TYPE_CHECKING:
    from radixserve.model_executor.forward_batch import ForwardBatch


class ImageOfStep(Protocol):
    """An image as a step hands it over (the scheduler's multimodal/image_items.ImageItem):
    pixels, its span, which span positions take features (`slots`, None: all), and its
    features once encoded (kept there by the model)."""

    pixel_values: torch.Tensor
    pixel_mask: torch.Tensor | None
    hash: int
    length: int
    slots: torch.Tensor | None
    features: torch.Tensor | None
    # A cropped image's (height, width, grid rows, grid cols) (LLaVA-OneVision / NeXT).
    anyres: tuple[int, int, int, int] | None

    @property
    def feature_count(self) -> int: ...


class ImagePiece(Protocol):
    """Tokens of one image's span in one step (multimodal/image_items.ImageChunk): flattened
    rows [row, row + length) are span positions [start, start + length)."""

    row: int
    image: ImageOfStep
    start: int
    length: int


# Encodes images (none of them cached) into one [feature_count, hidden] tensor each.
Encoder = Callable[[list[ImageOfStep], torch.device], list[torch.Tensor]]


def image_rows(
    chunks: Iterable[ImagePiece],
    device: torch.device,
    cache: VisionFeatureCache,
    encode: Encoder,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(flattened rows, their features) for this step's image pieces; images not encoded
    yet take their features from the cache by content hash, or are encoded together, once,
    and keep their features until their last piece runs."""
    chunks = list(chunks)
    fresh = []
    for image in {id(c.image): c.image for c in chunks if c.image.features is None}.values():
        cached = cache.get(image.hash)
        if cached is not None and cached.shape[0] == image.feature_count:
            image.features = cached.to(device)
        else:
            fresh.append(image)
    if fresh:
        for image, feats in zip(fresh, encode(fresh, device), strict=True):
            if feats.shape[0] != image.feature_count:
                raise ValueError(
                    f"an image gave {feats.shape[0]} features for {image.feature_count} tokens"
                )
            image.features = feats
            cache.put(image.hash, feats)
    rows, values = [], []
    for c in chunks:
        features = c.image.features
        assert features is not None
        slots = c.image.slots
        if slots is None:
            rows.append(torch.arange(c.row, c.row + c.length, device=device))
            values.append(features[c.start : c.start + c.length])
            continue
        # A tiled image's span: marker tokens keep their embeddings.
        piece = slots[c.start : c.start + c.length]
        at = torch.nonzero(piece >= 0).flatten()
        rows.append((at + c.row).to(device))
        values.append(features[piece[at].to(features.device)])
    return torch.cat(rows), torch.cat(values)


class ImageFeatureSteps:
    """What every vision-language model's forward does first (mixed into LLaVA, Idefics3 /
    SmolVLM, Gemma 3 and Qwen2-VL): the step's image pieces become the embedding overrides of
    their rows, from the feature cache or `_encode`. A model overrides `_encode` when its
    images are more than one stack of pixels through `self.vision` (tiles, crops, grids)."""

    feature_cache: VisionFeatureCache
    vision: torch.nn.Module

    def set_image_rows(self, forward_batch: ForwardBatch, device: torch.device) -> None:
        if forward_batch.image_chunks:
            forward_batch.embedding_overrides = image_rows(
                forward_batch.image_chunks, device, self.feature_cache, self._encode
            )

    def _encode(self, images: list[ImageOfStep], device: torch.device) -> list[torch.Tensor]:
        """Stacked pixels [B, 3, H, W] through the vision module: one feature tensor each."""
        return list(self.vision(torch.stack([im.pixel_values for im in images]).to(device)))


# LLaVA's and Gemma 3's checkpoints: the vision side under these prefixes (with or without a
# leading `model.`), the language model under `language_model.`.
VISION_TOWER_PREFIXES = ("vision_tower.", "multi_modal_projector.")


def language_and_vision_names(
    weights: Iterable[tuple[str, torch.Tensor]],
    vision_name: Callable[[str], str | None],
    vision_attr: str = "vision.",
) -> Iterator[tuple[str, torch.Tensor]]:
    """A LLaVA-style checkpoint's tensors under the model's names, as transformers writes them:
    `language_model.model.*` / `language_model.lm_head.*` (the published layout) or
    `model.language_model.*` / `lm_head.*` (transformers 5) become the language model's
    `model.*` / `lm_head.*`; `vision_tower.*` and `multi_modal_projector.*` become
    `vision_attr` + the vision module's name for them (`vision_name`; None: a tensor it has
    no parameter for, e.g. a stored position_ids buffer, skipped)."""
    for name, tensor in weights:
        plain = name.removeprefix("model.")
        if plain.startswith(VISION_TOWER_PREFIXES):
            target = vision_name(plain)
            if target is not None:
                yield f"{vision_attr}{target}", tensor
        elif plain.startswith(("language_model.lm_head.", "language_model.model.")):
            yield plain.removeprefix("language_model."), tensor
        elif plain.startswith("language_model."):
            yield "model." + plain.removeprefix("language_model."), tensor
        else:
            yield name, tensor  # lm_head.* of the newer layout
