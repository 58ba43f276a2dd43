"""load_model: model path + load options -> a model with weights on the target device."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from radixserve.layers.moe import FusedMoE
from radixserve.layers.quantization import MethodLayer
from radixserve.layers.weight_storage import HALF_DTYPES, stored_weights
from radixserve.models.config import ModelConfig, looks_like_hub_id
from radixserve.models.dummy import init_dummy_weights
from radixserve.models.quantize_on_load import SCHEMES, OnLoadQuantization
from radixserve.models.registry import get_model_class
from radixserve.models.weight_utils import (
    WeightFiles,
    checkpoint_matrix_dtype,
    find_weight_files,
    iterate_weights,
    resolve_local_model,
)

logger = logging.getLogger(__name__)

LOAD_FORMATS = ("auto", "safetensors", "pt", "gguf", "dummy")
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]


class LoadedModel(NamedTuple):
    model: nn.Module
    config: ModelConfig
    # An HF-style folder with config.json and the tokenizer files (for a GGUF: the converted
    # cache folder), suitable for get_tokenizer.
    model_dir: Path


def load_model(
    model_path: str,
    *,
    load_format: str = "auto",
    dtype: str = "auto",
    device: str = "cpu",
    revision: str | None = None,
    trust_remote_code: bool = False,
    context_length: int | None = None,
    json_model_override_args: str = "{}",
    download_dir: str | None = None,
    seed: int = 0,
    check_config: Callable[[ModelConfig], None] | None = None,
    gguf_blocks: bool = False,
    quantization: str | None = None,
) -> LoadedModel:
    """Build the model named by config.json and fill its weights (`seed` is for dummy).
    `check_config` may refuse the config before anything is built (e.g. --tp-size rules).
    `gguf_blocks` (--quantization gguf): a GGUF model's linear layers and embedding keep the
    file's quantized blocks (models/gguf_quant.py), read from the file without conversion.
    `quantization` naming a quantize-on-load scheme (models/quantize_on_load.py: w8a8_int8,
    bitsandbytes): the decoder projections become blocks layer by layer as they load."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(
            f"--load-format {load_format!r} is not supported; supported: {', '.join(LOAD_FORMATS)}"
        )
    start = time.perf_counter()
    gguf_file = _gguf_file(model_path, load_format) if gguf_blocks else None
    if gguf_blocks and gguf_file is None:
        raise ValueError(
            "--quantization gguf needs a GGUF model: pass a .gguf file as --model-path"
        )
    model_dir = resolve_model_dir(
        model_path, load_format, revision, download_dir, with_weights=gguf_file is None
    )
    config = ModelConfig.from_pretrained(
        model_dir,
        context_length=context_length,
        dtype=dtype,
        revision=revision,
        trust_remote_code=trust_remote_code,
        json_model_override_args=json_model_override_args,
        device=device,
    )
    if check_config is not None:
        check_config(config)
    model_class = get_model_class(config.architectures)
    target = torch.device(device)
    files = None
    if load_format != "dummy" and gguf_file is None:
        files = find_weight_files(model_dir, "auto" if load_format == "gguf" else load_format)
    stored = _stored_weight_dtype(files, config.dtype, target) if files is not None else None
    with _default_dtype(config.dtype), target, stored_weights(stored):
        model = model_class(config)
    on_load = _on_load_quantization(model, quantization, gguf_file is not None)
    if load_format == "dummy":
        init_dummy_weights(model, seed=seed)
        if on_load is not None:
            on_load.quantize_loaded()
    elif gguf_file is not None:
        from radixserve.models.gguf import gguf_architecture
        from radixserve.models.gguf_mmproj import find_mmproj, vision_tensors
        from radixserve.models.gguf_quant import load_gguf_weights

        # A LLaVA folder made from a GGUF and its mmproj file: the language model's type
        # decides the file's conventions; the vision tensors come from the mmproj file.
        text_type = str(getattr(config.hf_config, "text_config", config.hf_config).model_type)
        mmproj = find_mmproj(gguf_file) if text_type != config.model_type else None
        load_gguf_weights(
            model,
            gguf_file,
            config.num_attention_heads,
            config.num_key_value_heads,
            permuted_qk=text_type in ("llama", "mistral", "mixtral"),
            tied_lm_head=config.tie_word_embeddings,
            progress=_is_first_rank(),
            arch=gguf_architecture(text_type),
            extra_tensors=vision_tensors(mmproj) if mmproj is not None else None,
        )
    else:
        assert files is not None
        if on_load is not None:
            on_load.install()
        model.load_weights(iterate_weights(files, progress=_is_first_rank()))
    if on_load is not None:
        on_load.finish()
    # Every layer's method sees its weights complete (a layer still waiting for a shard the
    # checkpoint lacked says so here, if the loader's own check did not).
    for module in model.modules():
        if isinstance(module, MethodLayer):
            module.quant_method.process_weights_after_loading(module)
    model.eval()
    num_params = _count_weights(model)
    logger.info(
        "Loaded %s (%s, %.1fM parameters, %s on %s) in %.1f s",
        model_path,
        model_class.__name__,
        num_params / 1e6,
        str(config.dtype).removeprefix("torch."),
        target,
        time.perf_counter() - start,
    )
    return LoadedModel(model, config, model_dir)


def _on_load_quantization(
    model: nn.Module, quantization: str | None, from_gguf_blocks: bool
) -> OnLoadQuantization | None:
    scheme = SCHEMES.get(quantization or "")
    if scheme is None:
        return None
    if from_gguf_blocks:
        raise ValueError(
            f"--quantization {quantization} quantizes float checkpoints, not GGUF blocks"
        )
    return OnLoadQuantization(model, scheme)


def _stored_weight_dtype(
    files: WeightFiles, dtype: torch.dtype, device: torch.device
) -> torch.dtype | None:
    """A bfloat16/float16 safetensors checkpoint computed in float32 on the CPU keeps its big
    weights 16-bit (layers/weight_storage.py): half the memory, and exact, since every 16-bit
    value is a float32 value. Not under tensor or pipeline parallelism (their layers multiply
    the weights themselves)."""
    from radixserve.distributed import parallel_state

    if device.type != "cpu" or dtype != torch.float32 or not files.use_safetensors:
        return None
    if parallel_state.get_tp_size() != 1 or parallel_state.get_pp_size() != 1:
        return None
    found = checkpoint_matrix_dtype(files.files[0])
    if found not in HALF_DTYPES:
        return None
    logger.info(
        "%s checkpoint: linear weights and the embedding stay %s in memory, widened to "
        "float32 as they are used",
        str(found).removeprefix("torch."),
        str(found).removeprefix("torch."),
    )
    return found


def _count_weights(model: torch.nn.Module) -> int:
    """Float parameters plus the weights held as GGUF blocks (their float parameter is empty)."""
    total = sum(p.numel() for p in model.parameters())
    for module in model.modules():
        if isinstance(module, FusedMoE) and module.w13_weight.numel() == 0:
            per_expert = 3 * module.intermediate_size * module.hidden_size  # gate, up, down
            total += module.num_experts * per_expert
        gguf = module.quant_method.gguf_weight() if isinstance(module, MethodLayer) else None
        if gguf is not None:
            total += sum(part.out_features for part in gguf.pieces()) * _in_features(module)
    return total


def _in_features(module: torch.nn.Module) -> int:
    """K of a layer held as GGUF blocks (linear layers' input size, an embedding's width)."""
    for name in ("input_size", "in_features", "embedding_dim"):
        value = getattr(module, name, None)
        if isinstance(value, int):
            return value
    return 0


def _gguf_file(model_path: str, load_format: str) -> Path | None:
    from radixserve.models.gguf import find_gguf_file

    path = Path(os.path.expanduser(model_path))
    return find_gguf_file(path, force=load_format == "gguf") if path.exists() else None


def resolve_model_dir(
    model_path: str,
    load_format: str = "auto",
    revision: str | None = None,
    download_dir: str | None = None,
    with_weights: bool = True,
) -> Path:
    """The local HF folder for a model path: the folder itself, a GGUF's converted cache folder
    (without weights unless `with_weights`), or a hub download."""
    path = Path(os.path.expanduser(model_path))
    if path.exists():
        return resolve_local_model(path, load_format, with_weights)
    if not looks_like_hub_id(model_path):
        raise FileNotFoundError(f"model path {model_path} does not exist")
    return _download(model_path, load_format, revision, download_dir)


def _download(
    repo_id: str, load_format: str, revision: str | None, download_dir: str | None
) -> Path:
    from huggingface_hub import snapshot_download

    patterns = list(_HUB_PATTERNS)
    if load_format == "pt":
        patterns.append("*.bin")
    try:
        local = snapshot_download(
            repo_id, revision=revision, cache_dir=download_dir, allow_patterns=patterns
        )
    except Exception as e:
        raise FileNotFoundError(
            f"model path {repo_id} is not a local path and could not be downloaded: {e}"
        ) from e
    return Path(local)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    # Parameters are created with the default dtype; switching it builds the model directly
    # in the target dtype instead of building in float32 and converting (double memory).
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _is_first_rank() -> bool:
    from radixserve.distributed import parallel_state

    # One progress bar per server: TP rank 0 of pipeline stage 0.
    return parallel_state.get_tp_rank() == 0 and parallel_state.get_pp_rank() == 0
