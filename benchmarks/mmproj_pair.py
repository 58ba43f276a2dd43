"""A random LLaVA checkpoint (benchmarks/vision_ttft.py) as llama.cpp keeps it: the language
model as an F16 GGUF and the CLIP tower with its projector as `mmproj-*.gguf`, so llama-server
(`-m model.gguf --mmproj mmproj.gguf`) and radixserve (the pair's folder) run the same weights.

Tensor names come from gguf-py's name maps (the ones llama.cpp's converter uses); as llama.cpp's
LLaVA converter does, CLIP's last layer and its post-layernorm are left out (LLaVA reads the
second-to-last layer) and q/k rows of the language model are permuted for llama.cpp's rope.
The tokenizer (and chat template) is copied from a GGUF given (SmolLM2's), with `<image>` and
padding tokens appended up to the checkpoint's vocabulary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def _permute(weight: np.ndarray, heads: int) -> np.ndarray:
    # llama.cpp's rope pairs neighbouring rows; HF's pairs the two halves of each head.
    half = weight.shape[0] // heads // 2
    return weight.reshape(heads, 2, half, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _add(writer: Any, name: str, value: np.ndarray) -> None:
    import gguf

    if value.ndim >= 2:
        writer.add_tensor(name, value.astype(np.float16), raw_dtype=gguf.GGMLQuantizationType.F16)
    else:
        writer.add_tensor(name, value.astype(np.float32))


def _tokenizer(writer: Any, source: Path, vocab: int, image_token: int) -> None:
    """`source`'s tokenizer.* keys, its token list padded to `vocab` with `<image>` at
    `image_token` (a control token)."""
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(source)
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer.") or not field.types:
            continue
        value = field.contents()
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
            have = len(value)
            if have > image_token:
                raise ValueError(f"{source}'s vocabulary is larger than the image token id")
            extra = range(have, vocab)
            if key == "tokenizer.ggml.tokens":
                value = [*value, *("<image>" if i == image_token else f"<pad_{i}>" for i in extra)]
            else:
                value = [*value, *(3 for _ in extra)]
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, vtype, sub_type)


def write_language_model(hf: Any, path: Path, tokenizer_source: Path) -> Path:
    import gguf

    cfg = hf.config.text_config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = cfg.hidden_size // heads
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(path.stem)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    _tokenizer(writer, tokenizer_source, cfg.vocab_size, hf.config.image_token_index)
    for name, tensor in hf.state_dict().items():
        if name.startswith("model.language_model."):
            name = "model." + name.removeprefix("model.language_model.")
        elif not name.startswith("lm_head."):
            continue
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if target is None:
            raise ValueError(f"no GGUF name for {name}")
        value = tensor.float().numpy()
        if ".attn_q." in target:
            value = _permute(value, heads)
        elif ".attn_k." in target:
            value = _permute(value, kv_heads)
        _add(writer, target, np.ascontiguousarray(value))
    _finish(writer)
    return path


def write_mmproj(hf: Any, path: Path, image_mean: list[float], image_std: list[float]) -> Path:
    import gguf

    vision = hf.config.vision_config
    layers = int(vision.num_hidden_layers) - 1
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, layers)
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.has_llava_projector", True)
    writer.add_string("clip.projector_type", "mlp")
    writer.add_uint32("clip.vision.image_size", int(vision.image_size))
    writer.add_uint32("clip.vision.patch_size", int(vision.patch_size))
    writer.add_uint32("clip.vision.embedding_length", int(vision.hidden_size))
    writer.add_uint32("clip.vision.feed_forward_length", int(vision.intermediate_size))
    writer.add_uint32("clip.vision.projection_dim", int(hf.config.text_config.hidden_size))
    writer.add_uint32("clip.vision.attention.head_count", int(vision.num_attention_heads))
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", float(vision.layer_norm_eps))
    writer.add_uint32("clip.vision.block_count", layers)
    writer.add_array("clip.vision.image_mean", [float(x) for x in image_mean])
    writer.add_array("clip.vision.image_std", [float(x) for x in image_std])
    writer.add_bool("clip.use_gelu", vision.hidden_act == "gelu")
    for name, tensor in hf.state_dict().items():
        name = name.removeprefix("model.")
        value = np.ascontiguousarray(tensor.float().numpy())
        if name.startswith("multi_modal_projector."):
            linear, _, suffix = name.removeprefix("multi_modal_projector.").partition(".")
            _add(writer, f"mm.{0 if linear == 'linear_1' else 2}.{suffix}", value)
            continue
        if not name.startswith("vision_tower.") or ".post_layernorm." in name:
            continue
        if not name.startswith("vision_tower.vision_model."):
            name = "vision_tower.vision_model." + name.removeprefix("vision_tower.")
        layer = name.split(".encoder.layers.")[1].split(".")[0] if ".layers." in name else None
        if layer is not None and int(layer) >= layers:
            continue  # CLIP's last layer: LLaVA reads the one before
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if target is None:
            raise ValueError(f"no mmproj name for {name}")
        _add(writer, target, value)
    _finish(writer)
    return path


def _finish(writer: Any) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
