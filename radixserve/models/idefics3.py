"""Idefics3 and SmolVLM (Idefics3ForConditionalGeneration, SmolVLMForConditionalGeneration):
a SigLIP-like vision transformer and a connector (pixel shuffle, then a linear projection) turn
each tile of an image into `image_seq_len` features that replace the embeddings of the tile's
`<image>` tokens; the language model is the project's Llama, so its KV is paged and its prefixes
cached like any text model's. How many tiles an image becomes is the processor's choice, made on
the API side (multimodal/tiled_images.py); the image's span, markers included, is keyed in the
radix cache by the image's content hash.

The vision side is transformers' vision transformer and connector classes used as modules
(built from the checkpoint's config, their weights loaded by us). Checkpoints are read as
transformers saves them and as SmolVLM / Idefics3 are published: `model.vision_model.*`,
`model.connector.*`, `model.text_model.*`, `lm_head.*`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from radixserve.models.image_features import ImageFeatureSteps, ImageOfStep
from radixserve.models.llama import LlamaForCausalLM
from radixserve.models.vision_feature_cache import VisionFeatureCache, budget_bytes

if TYPE_CHECKING:
    from radixserve.model_executor.forward_batch import ForwardBatch
    from radixserve.models.config import ModelConfig

VISION = "vision."  # the TiledVisionEncoder's attribute name, prefixing its parameters
_TEXT_MODEL_TYPES = ("llama",)
# transformers' class-name prefix of each model type's vision transformer and connector.
_FAMILIES = {"idefics3": "Idefics3", "smolvlm": "SmolVLM"}


def image_seq_len(hf_config: Any) -> int:
    """Features one tile becomes: its patch grid, pixel-shuffled by scale_factor^2."""
    vision = hf_config.vision_config
    patches = (int(vision.image_size) // int(vision.patch_size)) ** 2
    scale = int(getattr(hf_config, "scale_factor", 2))
    if patches % (scale * scale):
        raise ValueError(f"a {patches}-patch tile does not pixel-shuffle by {scale}")
    return patches // (scale * scale)


def language_config(config: ModelConfig) -> ModelConfig:
    """The language model's view of the config: its text_config as the HF config."""
    text = config.hf_config.text_config
    model_type = str(getattr(text, "model_type", "llama"))
    if model_type not in _TEXT_MODEL_TYPES:
        raise ValueError(
            f"{config.model_type} with a {model_type!r} language model is not supported (llama)"
        )
    # transformers ties lm_head to the embeddings by the top-level config's flag for these
    # models (a published SmolVLM's text_config may say otherwise).
    tied = getattr(config.hf_config, "tie_word_embeddings", None)
    return dataclasses.replace(
        config,
        hf_config=text,
        architectures=("LlamaForCausalLM",),
        model_type=model_type,
        tie_word_embeddings=config.tie_word_embeddings if tied is None else bool(tied),
    )


class TiledVisionEncoder(nn.Module):
    """Tiles [N, 3, S, S] (and their pixel masks [N, S, S]) -> features [N, seq_len, hidden]."""

    def __init__(self, hf_config: Any) -> None:
        super().__init__()
        import importlib

        model_type = str(hf_config.model_type)
        if model_type not in _FAMILIES:
            raise ValueError(f"no tiled vision encoder for model type {model_type!r}")
        prefix = _FAMILIES[model_type]
        module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
        self.patch_size = int(hf_config.vision_config.patch_size)
        self.vision_model = getattr(module, f"{prefix}VisionTransformer")(hf_config.vision_config)
        self.connector = getattr(module, f"{prefix}Connector")(hf_config)

    @torch.inference_mode()
    def forward(self, pixels: torch.Tensor, pixel_mask: torch.Tensor | None) -> torch.Tensor:
        dtype = self.connector.modality_projection.proj.weight.dtype
        pixels = pixels.to(dtype)
        if pixel_mask is None:
            patch_mask = None
        else:
            # A patch takes part when any of its pixels is real (not the processor's padding).
            p = self.patch_size
            grid = pixel_mask.unfold(1, p, p).unfold(2, p, p)
            patch_mask = grid.sum(dim=(-1, -2)) > 0
        hidden = self.vision_model(pixel_values=pixels, patch_attention_mask=patch_mask)
        return self.connector(hidden.last_hidden_state)


class Idefics3ForConditionalGeneration(ImageFeatureSteps, LlamaForCausalLM):
    # The API side asks the model folder's processor for each image's tokens.
    image_layout = "tiles"

    def __init__(self, config: ModelConfig) -> None:
        from radixserve.distributed import parallel_state

        if parallel_state.get_pp_size() != 1:
            # The pipeline runs the stages' bodies directly, past forward's image features.
            raise ValueError(f"{config.model_type} runs with --pp-size 1 only")
        super().__init__(language_config(config))
        hf = config.hf_config
        self.vision = TiledVisionEncoder(hf)
        # Read by the scheduler (image intake), whose ImagePrompt reaches the API side.
        self.image_token_id = int(hf.image_token_id)
        self.tokens_per_image = image_seq_len(hf)  # per tile
        self.image_size = int(hf.vision_config.image_size)
        # Encoder outputs by image hash (--mm-preprocess-cache-size-mb; the runner sets it).
        self.feature_cache = VisionFeatureCache(budget_bytes(None))

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        self.set_image_rows(forward_batch, input_ids.device)
        return self.model(input_ids, positions, forward_batch)

    def _encode(self, images: list[ImageOfStep], device: torch.device) -> list[torch.Tensor]:
        """Every tile of `images` in one pass; each image's features [tiles * seq_len, hidden]."""
        pixels = torch.cat([im.pixel_values for im in images]).to(device)
        masks = None
        if any(im.pixel_mask is not None for im in images):
            masks = torch.cat(
                [
                    im.pixel_mask
                    if im.pixel_mask is not None
                    else torch.ones(im.pixel_values.shape[0], *im.pixel_values.shape[-2:])
                    for im in images
                ]
            ).to(device=device, dtype=torch.bool)
        features = self.vision(pixels, masks)
        tiles = [int(im.pixel_values.shape[0]) for im in images]
        return [f.reshape(-1, f.shape[-1]) for f in features.split(tiles)]

    def checkpoint_tensors(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The checkpoint's tensors under this model's names: the language model's as
        LlamaForCausalLM names them, the vision side's under `vision.`."""
        for name, tensor in weights:
            plain = name.removeprefix("model.")
            if plain.startswith(("vision_model.", "connector.")):
                yield f"{VISION}{plain}", tensor
            elif plain.startswith("text_model."):
                yield "model." + plain.removeprefix("text_model."), tensor
            else:
                yield name, tensor  # lm_head.*

    def param_shard(self, name: str) -> tuple[str, object] | None:
        # The vision side's tensors load whole (its q/k/v projections are not stacked).
        return (name, None) if name.startswith(VISION) else None


class SmolVLMForConditionalGeneration(Idefics3ForConditionalGeneration):
    """SmolVLM: Idefics3's architecture (its own transformers classes, the same layout)."""
