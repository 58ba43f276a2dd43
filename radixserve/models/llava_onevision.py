"""LLaVA-OneVision (LlavaOnevisionForConditionalGeneration: SigLIP + projector + Qwen2) and
LLaVA-NeXT / 1.6 (LlavaNextForConditionalGeneration: CLIP + projector + Llama or Mistral).

Both cut an image into crops ("anyres"): the model folder's image processor, on the API side
(multimodal/anyres_images.py), picks a rows x cols grid of crops from image_grid_pinpoints and
adds the whole image as a base crop. Here the tower encodes every crop; the crops' features
are laid out as one grid, cropped back to the image's aspect ratio (the rows or columns only
padding filled), for OneVision shrunk to about `anyres_max_N` crops' worth, and a learned
`image_newline` feature closes each grid row; the base crop's features come first. An image
that is one crop (OneVision's images when a request has several) is its features and one
newline. The API side counted the same features, so the span and the features agree.

The rest is LLaVA-1.5's (models/llava.py): the vision tower and projector, the language model,
the checkpoint layouts, plus `image_newline` (`model.image_newline` or `image_newline`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from radixserve.models.image_features import ImageOfStep
from radixserve.models.llava import VISION, LlavaForConditionalGeneration

if TYPE_CHECKING:
    from radixserve.models.config import ModelConfig

NEWLINE = "image_newline"


def anyres_max(hf_config: Any) -> int | None:
    """OneVision's vision_aspect_ratio "anyres_max_N" as N; None for a config without one."""
    ratio = getattr(hf_config, "vision_aspect_ratio", None)
    if ratio is None:
        return None
    text = str(ratio)
    if not text.startswith("anyres_max_") or not text.removeprefix("anyres_max_").isdigit():
        raise ValueError(f"vision_aspect_ratio {text!r} is not supported (anyres_max_<N>)")
    return int(text.removeprefix("anyres_max_"))


def unpad(grid: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """grid [C, H, W] without the rows (or columns) that only the padding of an image of
    height x width to the grid's aspect ratio filled, as much on each side."""
    grid_h, grid_w = grid.shape[1:]
    if width / height > grid_w / grid_h:
        pad = (grid_h - int(round(height * (grid_w / width), 7))) // 2
        return grid[:, pad : grid_h - pad, :]
    pad = (grid_w - int(round(width * (grid_h / height), 7))) // 2
    return grid[:, :, pad : grid_w - pad]


class LlavaOnevisionForConditionalGeneration(LlavaForConditionalGeneration):
    # The API side asks the model folder's processor for each image's crops.
    image_layout = "anyres"

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        hf = config.hf_config
        self.anyres_max = self._anyres_max(hf)
        # [C, H, W] grid sizes: side x side features per crop.
        self.side = int(hf.vision_config.image_size) // int(hf.vision_config.patch_size)
        if self.side * self.side != self.tokens_per_image:
            # The "full" strategy with a CLS token, or "default" without one: the features
            # are no square grid, which transformers reshapes wrongly too.
            raise ValueError(
                f"{config.model_type} needs a crop's features to be a square grid; "
                f"vision_feature_select_strategy {hf.vision_feature_select_strategy!r} gives "
                f"{self.tokens_per_image}"
            )
        self.vision.register_parameter(NEWLINE, nn.Parameter(torch.empty(config.hidden_size)))

    @staticmethod
    def _anyres_max(hf: Any) -> int | None:
        return anyres_max(hf) or 9  # transformers' default, "anyres_max_9"

    def _encode(self, images: list[ImageOfStep], device: torch.device) -> list[torch.Tensor]:
        """Every crop of `images` in one pass; each image's packed features."""
        pixels = torch.cat([im.pixel_values for im in images]).to(device)
        crops = self.vision(pixels).split([int(im.pixel_values.shape[0]) for im in images])
        return [self._pack(f, im.anyres) for im, f in zip(images, crops, strict=True)]

    def _pack(self, crops: torch.Tensor, anyres: tuple[int, int, int, int] | None) -> torch.Tensor:
        """crops [n, side * side, C] -> [features, C]: the base crop's features, then the
        unpadded grid of the others with a newline after each row (one newline only, for
        an image that is one crop)."""
        newline = getattr(self.vision, NEWLINE).to(crops.dtype)
        base = crops[0]
        if anyres is None:
            return torch.cat([base, newline[None]])
        height, width, rows, cols = anyres
        if crops.shape[0] != rows * cols + 1:
            raise ValueError(f"an image of {rows} x {cols} crops came with {crops.shape[0]} crops")
        side, channels = self.side, crops.shape[-1]
        # [rows, cols, side, side, C] -> [C, rows * side, cols * side]
        grid = crops[1:].reshape(rows, cols, side, side, channels)
        grid = grid.permute(4, 0, 2, 1, 3).reshape(channels, rows * side, cols * side)
        grid = unpad(grid, height, width)
        if self.anyres_max is not None:
            grid_h, grid_w = grid.shape[1:]
            ratio = math.sqrt(grid_h * grid_w / (self.anyres_max * side * side))
            if ratio > 1.1:
                size = [int(grid_h // ratio), int(grid_w // ratio)]
                grid = nn.functional.interpolate(grid[None], size, mode="bilinear")[0]
        column = newline[:, None, None].expand(channels, grid.shape[1], 1)
        rows_out = torch.cat([grid, column], dim=2).flatten(1, 2).transpose(0, 1)
        return torch.cat([base, rows_out])

    def checkpoint_tensors(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        def renamed() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                if name.removeprefix("model.") == NEWLINE:
                    # Routed past the vision prefixes below, straight to this model's name.
                    yield f"{VISION}{NEWLINE}", tensor
                else:
                    yield name, tensor

        yield from super().checkpoint_tensors(renamed())


class LlavaNextForConditionalGeneration(LlavaOnevisionForConditionalGeneration):
    """LLaVA-NeXT: the same crops and newlines, every image cropped, no grid shrinking."""

    @staticmethod
    def _anyres_max(hf: Any) -> int | None:
        return None
