"""The tiny random LLaVA (tests/helpers/tiny_llava.py) as llama.cpp keeps it: the language model
as a GGUF and the vision tower with its projector as an `mmproj-*.gguf`, written the way
llama.cpp's LLaVA converter writes them (tensor names from gguf-py's own name map, CLIP's last
layer and post-layernorm dropped, `clip.*` metadata)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tests.helpers.tiny_gguf import write_tiny_gguf
from tests.helpers.tiny_llava import IMAGE_TOKEN, VOCAB

# The tiny LLaVA's word vocabulary ("w<i>" is token i, "<image>" token 500) as GGUF tokens, but
# tokens 3 and 4 are "w" and "5", merged into "w5" (a BPE vocabulary needs one merge at least).
TOKENS = ["<unk>", "<s>", "</s>", "w", "5"] + [
    "<image>" if i == IMAGE_TOKEN else f"w{i}" for i in range(5, VOCAB)
]
MERGES = ["w 5"]


def language_model(llava: torch.nn.Module) -> torch.nn.Module:
    """transformers' LlamaForCausalLM holding `llava`'s language model weights."""
    from transformers import LlamaForCausalLM

    text = LlamaForCausalLM(llava.config.text_config).to(torch.float32)
    state = {}
    for name, value in llava.state_dict().items():
        if name.startswith("model.language_model."):
            state["model." + name.removeprefix("model.language_model.")] = value
        elif name.startswith("lm_head."):
            state[name] = value
    text.load_state_dict(state, strict=True)
    return text.eval()


def write_language_gguf(path: Path, llava: torch.nn.Module, quantize: bool = False) -> Path:
    return write_tiny_gguf(path, language_model(llava), quantize=quantize, tokens=(TOKENS, MERGES))


def write_mmproj(
    path: Path,
    llava: torch.nn.Module,
    image_mean: list[float],
    image_std: list[float],
    quantize: bool = False,
) -> Path:
    """`llava`'s CLIP tower and projector as an mmproj file (projector type mlp); 2-D weights
    Q8_0 when `quantize` (llama.cpp's converters quantize them too)."""
    import gguf

    vision = llava.config.vision_config
    layers = int(vision.num_hidden_layers) - 1  # LLaVA reads the second-to-last layer's output
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, layers)
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.has_llava_projector", True)
    writer.add_string("clip.projector_type", "mlp")
    writer.add_uint32("clip.vision.image_size", int(vision.image_size))
    writer.add_uint32("clip.vision.patch_size", int(vision.patch_size))
    writer.add_uint32("clip.vision.embedding_length", int(vision.hidden_size))
    writer.add_uint32("clip.vision.feed_forward_length", int(vision.intermediate_size))
    writer.add_uint32("clip.vision.projection_dim", int(vision.projection_dim))
    writer.add_uint32("clip.vision.attention.head_count", int(vision.num_attention_heads))
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", float(vision.layer_norm_eps))
    writer.add_uint32("clip.vision.block_count", layers)
    writer.add_array("clip.vision.image_mean", [float(x) for x in image_mean])
    writer.add_array("clip.vision.image_std", [float(x) for x in image_std])
    writer.add_bool("clip.use_gelu", vision.hidden_act == "gelu")
    for name, value in llava.state_dict().items():
        target = _mmproj_name(name.removeprefix("model."), names, layers)
        if target is None:
            continue
        array = np.ascontiguousarray(value.float().numpy())
        if quantize and array.ndim == 2 and array.shape[1] % 32 == 0 and "position" not in target:
            q8 = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(target, gguf.quants.quantize(array, q8), raw_dtype=q8)
        else:
            writer.add_tensor(target, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _mmproj_name(name: str, names: object, layers: int) -> str | None:
    if name.startswith("multi_modal_projector."):
        # The converter's names: linear_1 -> mm.0, linear_2 -> mm.2 (the GELU is mm.1).
        linear, _, suffix = name.removeprefix("multi_modal_projector.").partition(".")
        return f"mm.{0 if linear == 'linear_1' else 2}.{suffix}"
    if not name.startswith("vision_tower."):
        return None
    if not name.startswith("vision_tower.vision_model."):  # transformers 5 drops the level
        name = "vision_tower.vision_model." + name.removeprefix("vision_tower.")
    if ".post_layernorm." in name or name.endswith("position_ids"):
        return None  # LLaVA's features skip it; the converter drops it
    if (
        ".encoder.layers." in name
        and int(name.split(".encoder.layers.")[1].split(".")[0]) >= layers
    ):
        return None  # the last layer: dropped
    found = names.get_name(name, try_suffixes=(".weight", ".bias"))  # type: ignore[attr-defined]
    if found is None:
        raise ValueError(f"no mmproj name for {name}")
    return found
