"""config.json `architectures` -> model class, imported lazily."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Sequence

from torch import nn

logger = logging.getLogger(__name__)

# architecture name -> (module under radixserve.models, class name)
_MODELS: dict[str, tuple[str, str]] = {
    "DeepseekV2ForCausalLM": ("deepseek_v2", "DeepseekV2ForCausalLM"),
    "Gemma2ForCausalLM": ("gemma2", "Gemma2ForCausalLM"),
    "Gemma3ForCausalLM": ("gemma3", "Gemma3ForCausalLM"),
    # Gemma 3 with its SigLIP vision tower (models/gemma3_vision.py).
    "Gemma3ForConditionalGeneration": ("gemma3_vision", "Gemma3ForConditionalGeneration"),
    "GptOssForCausalLM": ("gpt_oss", "GptOssForCausalLM"),
    "GraniteForCausalLM": ("granite", "GraniteForCausalLM"),
    # Idefics3 / SmolVLM: tiled images, vision transformer + connector + Llama (models/idefics3.py).
    "Idefics3ForConditionalGeneration": ("idefics3", "Idefics3ForConditionalGeneration"),
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    # EAGLE draft heads (--speculative-algorithm EAGLE / EAGLE3 only).
    "LlamaForCausalLMEagle": ("llama_eagle", "LlamaForCausalLMEagle"),
    "LlamaForCausalLMEagle3": ("llama_eagle3", "LlamaForCausalLMEagle3"),
    # LLaVA-1.5: CLIP vision tower + projector + Llama (models/llava.py).
    "LlavaForConditionalGeneration": ("llava", "LlavaForConditionalGeneration"),
    # LLaVA-NeXT / OneVision: anyres crops + image_newline (models/llava_onevision.py).
    "LlavaNextForConditionalGeneration": ("llava_onevision", "LlavaNextForConditionalGeneration"),
    "LlavaOnevisionForConditionalGeneration": (
        "llava_onevision",
        "LlavaOnevisionForConditionalGeneration",
    ),
    "MistralForCausalLM": ("llama", "MistralForCausalLM"),
    "MixtralForCausalLM": ("mixtral", "MixtralForCausalLM"),
    "Olmo2ForCausalLM": ("olmo2", "Olmo2ForCausalLM"),
    "OlmoeForCausalLM": ("olmoe", "OlmoeForCausalLM"),
    "Phi3ForCausalLM": ("phi3", "Phi3ForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2ForCausalLM"),
    # Qwen2-VL / Qwen2.5-VL: dynamic-resolution vision transformer + Qwen2 with M-RoPE.
    "Qwen2VLForConditionalGeneration": ("qwen2_vl", "Qwen2VLForConditionalGeneration"),
    "Qwen2_5_VLForConditionalGeneration": ("qwen2_vl", "Qwen2_5_VLForConditionalGeneration"),
    "Qwen2MoeForCausalLM": ("qwen2_moe", "Qwen2MoeForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "SmolLM3ForCausalLM": ("smollm3", "SmolLM3ForCausalLM"),
    "SmolVLMForConditionalGeneration": ("idefics3", "SmolVLMForConditionalGeneration"),
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def get_model_class(architectures: Sequence[str]) -> type[nn.Module]:
    """The class for the first supported name in `architectures`."""
    for arch in architectures:
        if arch in _MODELS:
            module_name, class_name = _MODELS[arch]
            module = importlib.import_module(f"radixserve.models.{module_name}")
            return getattr(module, class_name)
    raise ValueError(
        f"Model architectures {list(architectures)} are not supported; supported: "
        f"{', '.join(supported_architectures())}"
    )
