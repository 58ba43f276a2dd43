"""llama.cpp's vision files (`mmproj-*.gguf`, read by its tools/mtmd/clip.cpp) beside a GGUF
language model: served as the LLaVA-1.5 model the pair came from.

llama.cpp keeps a vision-language model in two files: the language model (an ordinary GGUF)
and the vision tower with its projector (general.architecture "clip", `clip.*` metadata, tensor
names `v.*` and `mm.*`). A folder, or a `--model-path x.gguf`, with one file named `mmproj*.gguf`
beside the language model becomes a LlavaForConditionalGeneration folder in the GGUF cache:
config.json (the language model's config as `text_config`, the CLIP tower's from `clip.vision.*`
as `vision_config`), preprocessor_config.json (a CLIPImageProcessor with the file's image size,
mean and std: there is no processor config otherwise), and the vision tensors under
transformers' names, so models/llava.py serves it unchanged.

Only the LLaVA projector (`clip.projector_type` "mlp": mm.0, GELU, mm.2 over CLIP's patch
features, CLS dropped) is read; other projector types are refused by name. llama.cpp's LLaVA
converter drops CLIP's last layer (LLaVA reads the second-to-last layer's output) and its
post-layernorm, so the features are the output of the file's last block (`vision_feature_layer`
-1 over the stored blocks). No torch at import: the API process finds a GGUF's tokenizer folder
through models/gguf.py, which reads this file's metadata.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

MMPROJ_PREFIX = "mmproj"
SUPPORTED_PROJECTORS = ("mlp",)
IMAGE_TOKEN = "<image>"
# CLIP's defaults (OpenAI's), which llama.cpp's converters also fall back to.
_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

# llama.cpp tensor names -> transformers' LLaVA names (vision_tower.vision_model.* / projector).
_TOP_NAMES = {
    "v.class_embd": "vision_tower.vision_model.embeddings.class_embedding",
    "v.patch_embd.weight": "vision_tower.vision_model.embeddings.patch_embedding.weight",
    "v.position_embd.weight": "vision_tower.vision_model.embeddings.position_embedding.weight",
    "v.pre_ln.weight": "vision_tower.vision_model.pre_layrnorm.weight",
    "v.pre_ln.bias": "vision_tower.vision_model.pre_layrnorm.bias",
    "mm.0.weight": "multi_modal_projector.linear_1.weight",
    "mm.0.bias": "multi_modal_projector.linear_1.bias",
    "mm.2.weight": "multi_modal_projector.linear_2.weight",
    "mm.2.bias": "multi_modal_projector.linear_2.bias",
}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_out": "self_attn.out_proj",
    "attn_output": "self_attn.out_proj",  # (some older converters' name)
    "ln1": "layer_norm1",
    "ln2": "layer_norm2",
    "ffn_up": "mlp.fc1",
    "ffn_down": "mlp.fc2",
}
_BLOCK_RE = re.compile(r"^v\.blk\.(\d+)\.([a-z_0-9]+)\.(weight|bias)$")


@dataclasses.dataclass(frozen=True)
class MmprojVision:
    """What an mmproj file says about its vision tower and projector."""

    projector_type: str
    image_size: int
    patch_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    layer_norm_eps: float
    hidden_act: str  # transformers' name of the tower's activation
    image_mean: tuple[float, ...]
    image_std: tuple[float, ...]
    projector_bias: bool


def is_mmproj(path: Path) -> bool:
    return path.suffix.lower() == ".gguf" and path.name.lower().startswith(MMPROJ_PREFIX)


def find_mmproj(model_gguf: Path) -> Path | None:
    """The `mmproj*.gguf` beside `model_gguf`, or None; several are refused (which one is
    meant cannot be guessed)."""
    found = sorted(p for p in model_gguf.parent.glob("*") if p.is_file() and is_mmproj(p))
    found = [p for p in found if p.resolve() != model_gguf.resolve()]
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise ValueError(
            f"{model_gguf.parent} holds several mmproj files ({names}); keep one beside "
            f"{model_gguf.name}"
        )
    return found[0] if found else None


def _open(path: Path) -> Any:
    from gguf import GGUFReader

    try:
        return GGUFReader(path)
    except Exception as e:  # the reader raises assorted errors on truncated or foreign files
        raise ValueError(f"corrupt or unreadable mmproj file {path}: {e}") from e


def _field(reader: Any, key: str, path: Path, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise ValueError(f"mmproj file {path} has no {key} metadata")
        return default
    return field.contents()


def read_vision(path: Path, reader: Any = None) -> MmprojVision:
    """The vision hyper-parameters of mmproj file `path`; unsupported files are refused."""
    reader = reader if reader is not None else _open(path)
    arch = str(_field(reader, "general.architecture", path))
    if arch != "clip":
        raise ValueError(f"{path} is not a llama.cpp mmproj file (general.architecture {arch!r})")
    if not bool(_field(reader, "clip.has_vision_encoder", path, True)):
        raise ValueError(f"mmproj file {path} has no vision encoder")
    projector = str(
        _field(reader, "clip.projector_type", path, "")
        or _field(reader, "clip.vision.projector_type", path, "mlp")
    )
    if projector not in SUPPORTED_PROJECTORS:
        raise ValueError(
            f"mmproj file {path}: projector type {projector!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_PROJECTORS)} (LLaVA-1.5). To serve the language model "
            "alone, move the mmproj file out of its folder"
        )
    names = {t.name for t in reader.tensors}
    if "v.post_ln.weight" in names:
        # LLaVA's features skip CLIP's post-layernorm; a file that keeps one is another model.
        raise ValueError(f"mmproj file {path}: an mlp projector after v.post_ln is not supported")
    if "mm.0.weight" not in names or "mm.2.weight" not in names:
        raise ValueError(f"mmproj file {path} lacks the LLaVA projector tensors mm.0 / mm.2")
    if "v.class_embd" not in names:
        raise ValueError(f"mmproj file {path}: a CLIP tower without v.class_embd is not supported")
    gelu = bool(_field(reader, "clip.use_gelu", path, False))
    if bool(_field(reader, "clip.use_silu", path, False)):
        raise ValueError(f"mmproj file {path}: a SiLU vision tower is not supported")
    return MmprojVision(
        projector_type=projector,
        image_size=int(_field(reader, "clip.vision.image_size", path)),
        patch_size=int(_field(reader, "clip.vision.patch_size", path)),
        hidden_size=int(_field(reader, "clip.vision.embedding_length", path)),
        intermediate_size=int(_field(reader, "clip.vision.feed_forward_length", path)),
        num_layers=int(_field(reader, "clip.vision.block_count", path)),
        num_heads=int(_field(reader, "clip.vision.attention.head_count", path)),
        layer_norm_eps=float(_field(reader, "clip.vision.attention.layer_norm_epsilon", path)),
        # clip.cpp: GELU when use_gelu, else CLIP's quick GELU.
        hidden_act="gelu" if gelu else "quick_gelu",
        image_mean=tuple(float(x) for x in _field(reader, "clip.vision.image_mean", path, [])),
        image_std=tuple(float(x) for x in _field(reader, "clip.vision.image_std", path, [])),
        projector_bias="mm.0.bias" in names,
    )


def image_token_id(tokenizer_dir: Path, path: Path) -> int:
    """The id of `<image>` in the language model's vocabulary (the converted tokenizer): the
    placeholder the prompt carries for each image feature."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    if token_id is None or token_id == tokenizer.unk_token_id:
        raise ValueError(
            f"the language model beside {path.name} has no {IMAGE_TOKEN} token in its "
            "vocabulary; radixserve needs one as the image placeholder (LLaVA-1.5 files "
            "converted from llava-hf checkpoints have it)"
        )
    return int(token_id)


def write_llava_folder(mmproj: Path, out_dir: Path) -> MmprojVision:
    """Turn `out_dir`, a converted GGUF language model (config.json, tokenizer), into a LLaVA
    folder: config.json with the vision config, and the image processor's config."""
    from transformers import CLIPImageProcessor, CLIPVisionConfig, LlavaConfig

    vision = read_vision(mmproj)
    text = json.loads((out_dir / "config.json").read_text())
    if text.get("model_type") != "llama":
        raise ValueError(
            f"mmproj file {mmproj.name}: a {text.get('model_type')!r} language model is not "
            "supported with it (llama)"
        )
    tower = CLIPVisionConfig(
        hidden_size=vision.hidden_size,
        intermediate_size=vision.intermediate_size,
        num_hidden_layers=vision.num_layers,
        num_attention_heads=vision.num_heads,
        image_size=vision.image_size,
        patch_size=vision.patch_size,
        layer_norm_eps=vision.layer_norm_eps,
        hidden_act=vision.hidden_act,
    )
    grid = (vision.image_size // vision.patch_size) ** 2
    config = LlavaConfig(
        vision_config=tower.to_dict(),
        text_config=text,
        image_token_index=image_token_id(out_dir, mmproj),
        vision_feature_layer=-1,  # the file's last block (the converter dropped CLIP's last)
        vision_feature_select_strategy="default",
        projector_hidden_act="gelu",
        multimodal_projector_bias=vision.projector_bias,
        image_seq_length=grid,
        tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
    )
    config.architectures = ["LlavaForConditionalGeneration"]
    config.save_pretrained(out_dir)
    size = vision.image_size
    processor = CLIPImageProcessor(
        size={"shortest_edge": size},
        crop_size={"height": size, "width": size},
        image_mean=list(vision.image_mean or _CLIP_MEAN),
        image_std=list(vision.image_std or _CLIP_STD),
    )
    processor.save_pretrained(out_dir)
    return vision


def hf_vision_name(name: str) -> str:
    """transformers' LLaVA name of mmproj tensor `name`."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    match = _BLOCK_RE.match(name)
    if match and match.group(2) in _BLOCK_NAMES:
        module = _BLOCK_NAMES[match.group(2)]
        layer = f"vision_tower.vision_model.encoder.layers.{match.group(1)}"
        return f"{layer}.{module}.{match.group(3)}"
    raise ValueError(f"unknown mmproj tensor name {name!r}")


def vision_tensors(mmproj: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """The mmproj file's tensors, dequantised to float, under transformers' LLaVA names."""
    import numpy as np
    import torch
    from gguf import dequantize

    reader = _open(mmproj)
    for tensor in reader.tensors:
        try:
            name = hf_vision_name(tensor.name)
            data = dequantize(tensor.data, tensor.tensor_type)
        except Exception as e:
            raise ValueError(f"cannot read tensor {tensor.name} of {mmproj}: {e}") from e
        value = torch.from_numpy(np.array(data, dtype=np.float32, order="C", copy=True))
        if name.endswith("class_embedding"):
            value = value.reshape(-1)  # stored [1, hidden] by some converters
        yield name, value
