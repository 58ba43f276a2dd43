"""Qwen2-VL and Qwen2.5-VL (Qwen2VLForConditionalGeneration, Qwen2_5_VLForConditionalGeneration):
a vision transformer over an image's flattened patches at the resolution the model folder's
processor picked (its patch grid t x h x w), whose patch merger turns each 2 x 2 block of
patches into one feature; the features replace the embeddings of the image's `<|image_pad|>`
tokens (grid / merge^2 of them, expanded on the API side: multimodal/grid_images.py). The
language model is the project's Qwen2 with M-RoPE: image tokens rotate by (temporal, height,
width) positions, computed once per request from its layout (multimodal/mrope_positions.py) and
applied by layers/mrope.py.

The vision side is transformers' vision transformer (Qwen2.5-VL's with window attention) used
as a module built from the checkpoint's config, its weights loaded by us. Checkpoints are read as
published (`visual.*`, `model.*`, `lm_head.*`) and as transformers 5 lays a model out in memory
(`model.visual.*`, `model.language_model.*`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from radixserve.layers.mrope import MRotaryEmbedding
from radixserve.models.image_features import ImageFeatureSteps, ImageOfStep
from radixserve.models.qwen2 import Qwen2ForCausalLM
from radixserve.models.vision_feature_cache import VisionFeatureCache, budget_bytes

if TYPE_CHECKING:
    from radixserve.model_executor.forward_batch import ForwardBatch
    from radixserve.models.config import ModelConfig

VISUAL = "visual."  # the vision transformer's attribute name, prefixing its parameters
# model type -> transformers' module and vision transformer class.
_VISION_CLASSES = {
    "qwen2_vl": ("qwen2_vl", "Qwen2VisionTransformerPretrainedModel"),
    "qwen2_5_vl": ("qwen2_5_vl", "Qwen2_5_VisionTransformerPretrainedModel"),
}


def mrope_section(hf_config: Any) -> list[int]:
    """The rotary frequency split (temporal, height, width) from the config: transformers 5's
    text_config.rope_parameters, or an older config's rope_scaling."""
    for source in (getattr(hf_config, "text_config", None), hf_config):
        for attr in ("rope_parameters", "rope_scaling"):
            params = getattr(source, attr, None) or {}
            if "mrope_section" in params:
                return [int(s) for s in params["mrope_section"]]
    raise ValueError("the config has no mrope_section (rope_parameters / rope_scaling)")


def language_config(config: ModelConfig) -> ModelConfig:
    """The language model's view of the config: Qwen2 with plain rope parameters (M-RoPE's
    section split is applied by the model, not as a rope scaling)."""
    scaling = config.rope_scaling
    if scaling is not None and scaling.get("rope_type") in ("mrope", "default"):
        scaling = None
    if scaling is not None:
        raise ValueError(f"{config.model_type} with rope scaling {scaling} is not supported")
    # transformers ties lm_head to the embeddings by the top-level flag for these models (their
    # text_config has none: Qwen2.5-VL-3B is tied, the 7B models are not).
    tied = getattr(config.hf_config, "tie_word_embeddings", None)
    return dataclasses.replace(
        config,
        hf_config=getattr(config.hf_config, "text_config", config.hf_config),
        architectures=("Qwen2ForCausalLM",),
        model_type="qwen2",
        rope_scaling=None,
        attention_bias=True,
        tie_word_embeddings=config.tie_word_embeddings if tied is None else bool(tied),
    )


def vision_transformer(hf_config: Any) -> nn.Module:
    """transformers' vision transformer for the config's model type (patch merger included)."""
    import importlib

    model_type = str(hf_config.model_type)
    if model_type not in _VISION_CLASSES:
        raise ValueError(f"no Qwen2-VL vision transformer for model type {model_type!r}")
    module_name, class_name = _VISION_CLASSES[model_type]
    module = importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}")
    return getattr(module, class_name)(hf_config.vision_config)


class Qwen2VLForConditionalGeneration(ImageFeatureSteps, Qwen2ForCausalLM):
    # The API side asks the model folder's processor for each image's grid and tokens.
    image_layout = "grid"

    def __init__(self, config: ModelConfig) -> None:
        from radixserve.distributed import parallel_state

        if parallel_state.get_pp_size() != 1:
            # The pipeline runs the stages' bodies directly, past forward's image features
            # and M-RoPE positions.
            raise ValueError(f"{config.model_type} runs with --pp-size 1 only")
        text = language_config(config)
        super().__init__(text)
        hf = config.hf_config
        self.visual = vision_transformer(hf)
        self.spatial_merge_size = int(hf.vision_config.spatial_merge_size)
        # Read by the scheduler (image intake), whose ImagePrompt reaches the API side.
        self.image_token_id = int(hf.image_token_id)
        self.tokens_per_image = self.spatial_merge_size**2  # patches per image token
        self.image_size = 0  # any size: the processor picks the grid
        self.feature_cache = VisionFeatureCache(budget_bytes(None))
        self._use_mrope(text, mrope_section(hf))

    def _use_mrope(self, text: ModelConfig, section: list[int]) -> None:
        """Every layer rotates with one M-RoPE table in place of the plain one."""
        plain = self.model.rotary_emb
        rope = MRotaryEmbedding(
            plain.head_dim,
            plain.rotary_dim,
            plain.max_position,
            text.rope_theta,
            section,
            original_max_position=text.max_position_embeddings,
        )
        self.model.rotary_emb = rope
        for layer in self.model.layers:
            attn = getattr(layer, "self_attn", None)
            if attn is not None and attn.rotary_emb is not None:
                attn.rotary_emb = rope

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        self.set_image_rows(forward_batch, input_ids.device)
        if forward_batch.mrope_positions is not None:
            positions = forward_batch.mrope_positions
        return self.model(input_ids, positions, forward_batch)

    @torch.inference_mode()
    def _encode(self, images: list[ImageOfStep], device: torch.device) -> list[torch.Tensor]:
        """Every image's patches in one pass (attention stays within each image); each
        image's features [grid / merge^2, hidden]."""
        grids = [getattr(im, "grid_thw", None) for im in images]
        if any(g is None for g in grids):
            raise ValueError("an image reached the Qwen2-VL encoder without its patch grid")
        dtype = self.visual.patch_embed.proj.weight.dtype
        pixels = torch.cat([im.pixel_values for im in images]).to(device=device, dtype=dtype)
        grid = torch.tensor(grids, dtype=torch.int64, device=device)
        out = self.visual(pixels, grid_thw=grid)
        features = getattr(out, "pooler_output", out)  # transformers < 5 returns the tensor
        counts = [int(im.feature_count) for im in images]
        return list(features.split(counts))

    def checkpoint_tensors(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The checkpoint's tensors under this model's names: the language model's as
        Qwen2ForCausalLM names them, the vision transformer's under `visual.`."""
        for name, tensor in weights:
            plain = name.removeprefix("model.")
            if plain.startswith(VISUAL):
                yield plain, tensor
            elif plain.startswith("language_model."):
                yield "model." + plain.removeprefix("language_model."), tensor
            else:
                yield name, tensor  # model.layers.*, model.embed_tokens.*, lm_head.*

    def param_shard(self, name: str) -> tuple[str, object] | None:
        # The vision transformer's tensors load whole (its qkv is one fused projection).
        return (name, None) if name.startswith(VISUAL) else None


class Qwen2_5_VLForConditionalGeneration(Qwen2VLForConditionalGeneration):
    """Qwen2.5-VL: a vision transformer with window attention and an RMSNorm merger (its own
    transformers class); the same language model, M-RoPE and checkpoint layout."""
