"""LLaVA-1.5 (LlavaForConditionalGeneration): a CLIP vision tower and a projector turn each image
into features (models/vision_tower.py) that replace the embeddings of its placeholder tokens;
the language model is the project's Llama, Mistral or Qwen2 (text_config's model_type), so its
KV is paged and its prefixes cached like any text model's (an image's tokens are keyed by its content hash, multimodal/image_prompt.py).

Checkpoints are read as transformers writes them: `language_model.model.*` /
`language_model.lm_head.*` (LLaVA-1.5 on the hub, and transformers 5's save_pretrained), or
`model.language_model.*` / `lm_head.*`; `vision_tower.*` and `multi_modal_projector.*` with or
without a leading `model.`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch

from radixserve.models.image_features import ImageFeatureSteps, language_and_vision_names
from radixserve.models.llama import AttentionOptions, LlamaForCausalLM, MistralForCausalLM
from radixserve.models.qwen2 import Qwen2ForCausalLM
from radixserve.models.vision_feature_cache import VisionFeatureCache, budget_bytes
from radixserve.models.vision_tower import VisionEncoder, tokens_per_image

if TYPE_CHECKING:
    from radixserve.model_executor.forward_batch import ForwardBatch
    from radixserve.models.config import ModelConfig

VISION = "vision."  # the VisionEncoder's attribute name, prefixing its parameters
# text_config's model_type -> the language model class, whose attention options (q/k/v
# biases, sliding window) the LLaVA model takes; the layers and their names are Llama's.
TEXT_MODELS: dict[str, type[LlamaForCausalLM]] = {
    "llama": LlamaForCausalLM,
    "mistral": MistralForCausalLM,
    "qwen2": Qwen2ForCausalLM,
}


def language_config(config: ModelConfig) -> ModelConfig:
    """The language model's view of a LLaVA config: its text_config as the HF config."""
    text = config.hf_config.text_config
    model_type = str(getattr(text, "model_type", "llama"))
    if model_type not in TEXT_MODELS:
        raise ValueError(
            f"{config.model_type} with a {model_type!r} language model is not supported "
            f"({', '.join(TEXT_MODELS)})"
        )
    return dataclasses.replace(
        config,
        hf_config=text,
        architectures=(TEXT_MODELS[model_type].__name__,),
        model_type=model_type,
    )


class LlavaForConditionalGeneration(ImageFeatureSteps, LlamaForCausalLM):
    def __init__(self, config: ModelConfig) -> None:
        from radixserve.distributed import parallel_state

        if parallel_state.get_pp_size() != 1:
            # The pipeline runs the stages' bodies directly, past forward's image features.
            raise ValueError("LLaVA runs with --pp-size 1 only")
        super().__init__(language_config(config))
        hf = config.hf_config
        self.vision = VisionEncoder(hf, config.hidden_size)
        token_id = getattr(hf, "image_token_index", None)
        if token_id is None:
            token_id = hf.image_token_id
        # Read by the scheduler (image intake), whose ImagePrompt reaches the API side.
        self.image_token_id = int(token_id)
        self.tokens_per_image = tokens_per_image(hf)
        self.image_size = int(hf.vision_config.image_size)
        # Encoder outputs by image hash (--mm-preprocess-cache-size-mb; the runner sets it).
        self.feature_cache = VisionFeatureCache(budget_bytes(None))

    @classmethod
    def attention_options(cls, config: ModelConfig) -> AttentionOptions:
        # `config` is the language model's (language_config): its class decides.
        return TEXT_MODELS[config.model_type].attention_options(config)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        self.set_image_rows(forward_batch, input_ids.device)
        return self.model(input_ids, positions, forward_batch)

    def checkpoint_tensors(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The checkpoint's tensors under this model's names: the language model's as
        LlamaForCausalLM names them, the vision side's under `vision.`."""
        return language_and_vision_names(weights, self.vision.param_name, VISION)

    def param_shard(self, name: str) -> tuple[str, object] | None:
        # The vision side's tensors load whole (CLIP's q/k/v projections are not stacked).
        return (name, None) if name.startswith(VISION) else None
