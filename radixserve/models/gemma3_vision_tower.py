"""Gemma 3's image side: a SigLIP vision encoder and Gemma 3's multi-modal projector, in plain
PyTorch.

The encoder is transformers' SiglipVisionModel used as a module (built from the checkpoint's
vision_config, its weights loaded by us), as LLaVA's CLIP is (models/vision_tower.py): it runs
once per image at prefill, off the paged-KV path. Its last hidden state (after the post
layernorm) is a patch grid that the projector average-pools down to mm_tokens_per_image
tokens, normalises with a Gemma RMSNorm (scale 1 + weight) and multiplies by
mm_input_projection_weight [vision hidden, text hidden] (a bare matrix, no bias).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def tokens_per_image(hf_config: Any) -> int:
    """mm_tokens_per_image, checked against the patch grid it pools."""
    tokens = int(getattr(hf_config, "mm_tokens_per_image", 256))
    side = math.isqrt(tokens)
    patches = int(hf_config.vision_config.image_size) // int(hf_config.vision_config.patch_size)
    if side * side != tokens or patches % side:
        raise ValueError(
            f"mm_tokens_per_image {tokens} must be a square whose side divides the "
            f"{patches}x{patches} patch grid"
        )
    return tokens


class SoftEmbeddingNorm(nn.Module):
    """Gemma's RMSNorm (x / rms(x) * (1 + weight)) computed in float32, as transformers'
    Gemma3RMSNorm is; the projector's input norm (not the serving layers' fused kernels:
    this runs once per image)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


class Gemma3Projector(nn.Module):
    """Patch features [B, patches, vision hidden] -> image tokens [B, tokens, text hidden]."""

    def __init__(self, hf_config: Any, text_hidden: int) -> None:
        super().__init__()
        vision = hf_config.vision_config
        width = int(vision.hidden_size)
        self.patches_per_side = int(vision.image_size) // int(vision.patch_size)
        self.kernel = self.patches_per_side // math.isqrt(tokens_per_image(hf_config))
        self.mm_input_projection_weight = nn.Parameter(
            torch.zeros(width, text_hidden), requires_grad=False
        )
        self.mm_soft_emb_norm = SoftEmbeddingNorm(width, float(vision.layer_norm_eps))

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        batch, _, width = patches.shape
        side = self.patches_per_side
        grid = patches.transpose(1, 2).reshape(batch, width, side, side)
        pooled = nn.functional.avg_pool2d(grid, self.kernel, self.kernel)
        tokens = self.mm_soft_emb_norm(pooled.flatten(2).transpose(1, 2))
        return torch.matmul(tokens, self.mm_input_projection_weight).type_as(patches)


class Gemma3VisionEncoder(nn.Module):
    """Pixels [B, 3, H, W] -> image features [B, mm_tokens_per_image, text hidden]."""

    def __init__(self, hf_config: Any, text_hidden: int) -> None:
        super().__init__()
        from transformers import SiglipVisionModel

        self.vision_tower = SiglipVisionModel(hf_config.vision_config)
        self.multi_modal_projector = Gemma3Projector(hf_config, text_hidden)
        self._names: dict[str, str] | None = None

    @torch.inference_mode()
    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        dtype = self.multi_modal_projector.mm_input_projection_weight.dtype
        out = self.vision_tower(pixel_values=pixel_values.to(dtype))
        return self.multi_modal_projector(out.last_hidden_state)

    def param_name(self, name: str) -> str | None:
        """This module's name for checkpoint tensor `name` (`vision_tower.*` with or without
        SigLIP's `vision_model.` level, or `multi_modal_projector.*`); None for a tensor it
        has no parameter for (a stored buffer such as position_ids)."""
        if self._names is None:
            self._names = {_plain(n): n for n, _ in self.named_parameters()}
        return self._names.get(_plain(name))


def _plain(name: str) -> str:
    return name.replace("vision_tower.vision_model.", "vision_tower.")
