"""LLaVA's image side: a CLIP (or SigLIP) vision encoder and the multi-modal projector, in plain
PyTorch.

The encoder is transformers' CLIPVisionModel (SiglipVisionModel for LLaVA-OneVision) used as a
module (built from the checkpoint's
vision_config, its weights loaded by us): it runs once per image at prefill, off the paged-KV
path, so it needs none of the serving layers. The features are the hidden states of
`vision_feature_layer` (a list: several layers concatenated), without the CLS token under the
"default" select strategy, projected to the language model's width.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def feature_layers(hf_config: Any) -> list[int]:
    layer = getattr(hf_config, "vision_feature_layer", -2)
    return [int(x) for x in layer] if isinstance(layer, list | tuple) else [int(layer)]


def tokens_per_image(hf_config: Any) -> int:
    """Features one image (crop) becomes: a patch grid, plus CLIP's CLS token under the "full"
    strategy (SigLIP has none; "default" drops the first feature either way)."""
    vision = hf_config.vision_config
    grid = (int(vision.image_size) // int(vision.patch_size)) ** 2
    cls_token = 0 if str(getattr(vision, "model_type", "")).startswith("siglip") else 1
    return grid + cls_token - (1 if select_strategy(hf_config) == "default" else 0)


def select_strategy(hf_config: Any) -> str:
    strategy = str(getattr(hf_config, "vision_feature_select_strategy", "default"))
    if strategy not in ("default", "full"):
        raise ValueError(f"vision_feature_select_strategy {strategy!r} is not supported")
    return strategy


class MultiModalProjector(nn.Module):
    """linear_1, activation, linear_2 (LLaVA-1.5's two-layer MLP)."""

    def __init__(self, in_features: int, out_features: int, act: str, bias: bool) -> None:
        super().__init__()
        from transformers.activations import ACT2FN

        self.linear_1 = nn.Linear(in_features, out_features, bias=bias)
        self.act = ACT2FN[act]
        self.linear_2 = nn.Linear(out_features, out_features, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class VisionEncoder(nn.Module):
    """Pixels [B, 3, H, W] -> projected image features [B, tokens_per_image, text hidden]."""

    vision_tower: nn.Module

    def __init__(self, hf_config: Any, text_hidden: int) -> None:
        super().__init__()
        from transformers import AutoModel

        vision = hf_config.vision_config
        self.layers = feature_layers(hf_config)
        self.strategy = select_strategy(hf_config)
        # CLIPVisionModel or SiglipVisionModel, as transformers builds the tower.
        self.vision_tower = AutoModel.from_config(vision)
        # The features are hidden states; the post-layernorm only serves the pooled output,
        # which LLaVA never reads (llama.cpp's mmproj files leave it out).
        self.vision_tower.post_layernorm = nn.Identity()
        self.multi_modal_projector = MultiModalProjector(
            int(vision.hidden_size) * len(self.layers),
            text_hidden,
            str(getattr(hf_config, "projector_hidden_act", "gelu")),
            bool(getattr(hf_config, "multimodal_projector_bias", True)),
        )
        self._names: dict[str, str] | None = None

    @torch.inference_mode()
    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        dtype = self.multi_modal_projector.linear_1.weight.dtype
        out = self.vision_tower(pixel_values.to(dtype), output_hidden_states=True)
        picked = [out.hidden_states[i] for i in self.layers]
        if self.strategy == "default":
            picked = [h[:, 1:] for h in picked]
        return self.multi_modal_projector(torch.cat(picked, dim=-1))

    def param_name(self, name: str) -> str | None:
        """This module's name for checkpoint tensor `name` (`vision_tower.*` or
        `multi_modal_projector.*`), whichever way the checkpoint nests CLIP's modules (with or
        without its `vision_model.` level); None for a tensor it has no parameter for."""
        if self._names is None:
            self._names = {_plain(n): n for n, _ in self.named_parameters()}
        return self._names.get(_plain(name))


def _plain(name: str) -> str:
    return name.replace("vision_tower.vision_model.", "vision_tower.")
