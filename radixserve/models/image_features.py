"""A step's image features for the rows of its image tokens, shared by the vision models
(LLaVA, Gemma 3): images not encoded yet take their features from the feature cache by content
hash, or are encoded together, once, and keep their features until their last piece runs."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixserve.models.llava import ImagePiece
    from radixserve.models.vision_feature_cache import VisionFeatureCache


def image_rows(
    encode: Callable[[torch.Tensor], torch.Tensor],
    cache: VisionFeatureCache,
    chunks: Iterable[ImagePiece],
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(flattened rows, their features [rows, hidden]) for this step's image pieces;
    `encode` takes stacked pixels [B, 3, H, W] to features [B, tokens, hidden]."""
    chunks = list(chunks)
    fresh = []
    for image in {id(c.image): c.image for c in chunks if c.image.features is None}.values():
        cached = cache.get(image.hash)
        if cached is not None and cached.shape[0] == image.length:
            image.features = cached.to(device)
        else:
            fresh.append(image)
    if fresh:
        pixels = torch.stack([im.pixel_values for im in fresh]).to(device)
        features = encode(pixels)
        for image, feats in zip(fresh, features, strict=True):
            if feats.shape[0] != image.length:
                raise ValueError(
                    f"an image gave {feats.shape[0]} features for {image.length} tokens"
                )
            image.features = feats
            cache.put(image.hash, feats)
    rows = torch.cat([torch.arange(c.row, c.row + c.length, device=device) for c in chunks])
    values = torch.cat([c.image.features[c.start : c.start + c.length] for c in chunks])
    return rows, values
