"""GGUF checkpoints: dequantise once into a cached Hugging Face folder.

The folder (config.json, safetensors, tokenizer files with the chat template) lives under
<user cache>/radixserve/gguf/<name>-<size>-<hash of the file's size, first 4 MiB and last
1 MiB> (so copies, reinstalls and clones of the same file share it; RADIXSERVE_CACHE_DIR moves
the root; `radixserve cache list|clear` manages it) and is written to a temp
folder then renamed, so a half-written conversion is never used and the second start skips the
conversion entirely. Config and tokenizer come from transformers' GGUF readers (the config fields
they leave out are filled from the metadata by gguf_config.py); tensor names, llama.cpp's q/k row
permutation and Gemma's norm weights (stored plus one) are handled here.

Longer than the project's ~450-line norm: the conversion and the GGUF-to-transformers tensor
naming it writes with are one contract (gguf_quant.py reads the same names back), kept in one
file so a new architecture's names are added in one place.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm.auto import tqdm

from radixserve.utils.gguf_cache import (  # noqa: F401  (re-exported: cache CLI, tests)
    CONVERTER_VERSION,
    cache_root,
    cached_folder,
    content_fingerprint,
)

if TYPE_CHECKING:
    # Imported where tensors are made: the API process finds a GGUF's tokenizer folder through
    # this module and must not import torch.
    import torch

logger = logging.getLogger(__name__)

SHARD_BYTES = 2 * 2**30

# general.architecture values we convert (llama.cpp stores Mistral as llama).
_GGUF_ARCHITECTURES = (
    "llama",
    "qwen2",
    "qwen3",
    "gemma2",
    "gemma3",
    "qwen2moe",
    "qwen3moe",
    "olmoe",
    "gpt-oss",
    "deepseek2",
)
# transformers' model_type for a GGUF -> the HF architecture written to config.json.
_HF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
}
# model_type -> general.architecture, where they differ.
_GGUF_ARCHITECTURE_OF = {
    "mistral": "llama",
    "mixtral": "llama",
    "gemma3_text": "gemma3",
    "qwen2_moe": "qwen2moe",
    "qwen3_moe": "qwen3moe",
    "gpt_oss": "gpt-oss",
    "deepseek_v2": "deepseek2",
}
_MOE_ARCHITECTURES = ("qwen2moe", "qwen3moe")
# Architectures transformers' GGUF readers do not know: their config is built from the metadata
# here (gguf_config.py), their tokenizer by the fast tokenizer's own GGUF reading.
_OWN_CONFIG_ARCHITECTURES = ("olmoe", "gpt-oss", "deepseek2")
# Architectures whose q/k rows llama.cpp's converter permuted (for its rope kernel).
_PERMUTED_QK = {"llama"}
_GEMMA_ARCHITECTURES = ("gemma2", "gemma3")
# Architectures whose norm weights llama.cpp's converter stored plus one (Gemma's norms scale
# by 1 + weight; llama.cpp's multiply by the weight): every "*norm.weight", q/k norms included.
_NORMS_PLUS_ONE = frozenset(_GEMMA_ARCHITECTURES)

_TOP_LEVEL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    # Mixture-of-experts layers: the router, the experts stacked [experts, rows, cols] (split
    # per expert on load, layers/moe/checkpoint.py) and the shared expert with its gate.
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
# Gemma's four norms per layer: llama.cpp calls the pre-feedforward one ffn_norm, the name
# Llama's post-attention (pre-MLP) norm has.
_GEMMA_BLOCK_NAMES = {
    **_BLOCK_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# gpt-oss: llama.cpp names its pre-MLP norm post_attention_norm; the router (with a bias) is
# transformers' mlp.router; the per-head sinks attn_sinks. Its experts carry biases
# (ffn_*_exps.bias, [experts, rows]), split per expert on load like the weights.
_GPT_OSS_BLOCK_NAMES = {
    **_BLOCK_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_gate_inp": "mlp.router",
    "attn_sinks": "self_attn.sinks",
}
# DeepSeek-V2's multi-head latent attention. Newer llama.cpp files split kv_b_proj into
# attn_k_b (its key half, transposed per head) and attn_v_b; they load under llama.cpp's
# converter's names k_b_proj / v_b_proj, which the model joins back (deepseek_v2_checkpoint.py).
_DEEPSEEK2_BLOCK_NAMES = {
    **_BLOCK_NAMES,
    "attn_q_a": "self_attn.q_a_proj",
    "attn_q_a_norm": "self_attn.q_a_layernorm",
    "attn_q_b": "self_attn.q_b_proj",
    "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
    "attn_kv_a_norm": "self_attn.kv_a_layernorm",
    "attn_kv_b": "self_attn.kv_b_proj",
    "attn_k_b": "self_attn.k_b_proj",
    "attn_v_b": "self_attn.v_b_proj",
}
_BLOCK_NAMES_OF = {
    **dict.fromkeys(_GEMMA_ARCHITECTURES, _GEMMA_BLOCK_NAMES),
    "gpt-oss": _GPT_OSS_BLOCK_NAMES,
    "deepseek2": _DEEPSEEK2_BLOCK_NAMES,
}
# Present in some GGUFs but derived from the config on our side.
_IGNORED_NAMES = {"rope_freqs"}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(.+)$")
# Mixtral files converted before llama.cpp stacked experts hold one tensor per expert:
# blk.N.ffn_{gate,up,down}.E.weight.
_OLD_EXPERT_RE = re.compile(r"^(ffn_gate|ffn_up|ffn_down)\.(\d+)$")
_OLD_EXPERT_NAMES = {"ffn_gate": "gate_proj", "ffn_up": "up_proj", "ffn_down": "down_proj"}


def find_gguf_file(path: Path, force: bool = False) -> Path | None:
    """The GGUF behind a model path: the file itself, or the only .gguf in a folder without a
    config.json (with `force`, even when there is one). None when it is not a GGUF model."""
    from radixserve.models.gguf_mmproj import is_mmproj

    if path.is_file():
        if is_mmproj(path):
            raise ValueError(
                f"{path.name} is a llama.cpp mmproj (vision) file: pass the language model's "
                "GGUF (or their folder) as the model; the mmproj file beside it is found"
            )
        return path if path.suffix.lower() == ".gguf" or force else None
    if not path.is_dir() or ((path / "config.json").is_file() and not force):
        return None
    # A vision model's mmproj file sits beside its language model (models/gguf_mmproj.py).
    found = sorted(p for p in path.glob("*.gguf") if not is_mmproj(p))
    if len(found) > 1:
        names = ", ".join(f.name for f in found)
        raise ValueError(f"{path} holds several GGUF files ({names}); pass one file as the model")
    if not found and force:
        raise FileNotFoundError(f"no .gguf file in {path}")
    return found[0] if found else None


def ensure_converted(gguf_path: Path) -> Path:
    """The cached HF folder for `gguf_path`, converting it first if needed."""
    _check_exists(gguf_path)
    return _ensure_folder(gguf_path, converted_folder(gguf_path), with_weights=True)


def converted_folder(gguf_path: Path) -> Path:
    """Where the conversion of `gguf_path` lives: with an mmproj file beside it, a folder of
    its own keyed by both files (the pair is a vision model, the file alone a text model)."""
    from radixserve.models.gguf_mmproj import find_mmproj

    folder = cached_folder(gguf_path)
    mmproj = find_mmproj(gguf_path)
    if mmproj is None:
        return folder
    return folder.with_name(f"{folder.name}-mmproj-{content_fingerprint(mmproj)}")


def ensure_metadata(gguf_path: Path) -> Path:
    """A cached folder with `gguf_path`'s config.json and tokenizer files but no weights (what
    --quantization gguf, which reads the weights from the file itself, and the tokenizer need).
    A full conversion made earlier serves as well."""
    _check_exists(gguf_path)
    full = converted_folder(gguf_path)  # hashes the file's head and tail: once per call
    if full.is_dir():
        return full
    return _ensure_folder(gguf_path, full.with_name(f"{full.name}-meta"), with_weights=False)


def _check_exists(gguf_path: Path) -> None:
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file {gguf_path} does not exist")


def _ensure_folder(gguf_path: Path, target: Path, with_weights: bool) -> Path:
    if target.is_dir():
        logger.info("Using the converted GGUF cached at %s", target)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # The lock keeps concurrent starts (TP ranks, tokenizer and scheduler processes) from
    # converting the same file twice.
    with _file_lock(target.parent / f".{target.name}.lock"):
        if target.is_dir():
            return target
        # Leftovers of a conversion that was killed: nobody else can be using them (we hold
        # the lock).
        for stale in target.parent.glob(f".tmp-{target.name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
        try:
            convert_gguf(gguf_path, tmp, with_weights=with_weights)
            os.rename(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    logger.info("Converted %s to %s", gguf_path, target)
    return target


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def convert_gguf(gguf_path: Path, out_dir: Path, with_weights: bool = True) -> None:
    """Write config.json, tokenizer files and (with_weights) dequantised safetensors for
    `gguf_path`."""
    from gguf import GGUFReader

    from radixserve.models.gguf_mmproj import find_mmproj

    mmproj = find_mmproj(gguf_path)
    try:
        reader = GGUFReader(gguf_path)
    except Exception as e:  # the reader raises assorted errors on truncated or foreign files
        raise ValueError(f"corrupt or unreadable GGUF file {gguf_path}: {e}") from e
    arch = _read_string(reader, "general.architecture", gguf_path)
    if arch not in _GGUF_ARCHITECTURES:
        supported = ", ".join(_GGUF_ARCHITECTURES)
        raise ValueError(
            f"GGUF architecture {arch!r} in {gguf_path} is not supported; supported: {supported}"
        )
    _check_tensor_types(reader, gguf_path)
    config = _write_config(reader, arch, gguf_path, out_dir)
    _write_tokenizer(gguf_path, out_dir, arch)
    if arch in _GEMMA_ARCHITECTURES:
        from radixserve.models.gguf_config import gemma_stop_ids

        # Read by ModelConfig as a safetensors checkpoint's would be.
        stops = {"eos_token_id": gemma_stop_ids(reader)}
        (out_dir / "generation_config.json").write_text(json.dumps(stops, indent=2) + "\n")
    if mmproj is not None:
        from radixserve.models.gguf_mmproj import write_llava_folder

        write_llava_folder(mmproj, out_dir)
        logger.info("%s: vision tower and projector from %s (LLaVA)", gguf_path.name, mmproj.name)
    if with_weights:
        permute = arch in _PERMUTED_QK
        heads = (
            config.num_attention_heads,
            config.num_key_value_heads or config.num_attention_heads,
        )
        _write_tensors(reader, gguf_path, out_dir, arch, heads if permute else None, mmproj)
    marker = {
        "source": str(gguf_path.resolve()),
        "mmproj": str(mmproj.resolve()) if mmproj is not None else None,
        "converter_version": CONVERTER_VERSION,
        "weights": with_weights,
    }
    (out_dir / "radixserve_gguf.json").write_text(json.dumps(marker, indent=2) + "\n")


def _check_tensor_types(reader: object, gguf_path: Path) -> None:
    """Refuse a file with tensors of block types radixserve cannot read, naming them, before
    anything is converted or loaded."""
    from radixserve.layers.gguf_formats import SUPPORTED_TYPES, type_name

    unknown: dict[str, list[str]] = {}
    for tensor in reader.tensors:  # type: ignore[attr-defined]
        qtype = int(tensor.tensor_type)
        if qtype not in SUPPORTED_TYPES:
            name = getattr(tensor.tensor_type, "name", type_name(qtype))
            unknown.setdefault(name, []).append(tensor.name)
    if unknown:
        found = "; ".join(f"{t} ({len(n)} tensors, e.g. {n[0]})" for t, n in unknown.items())
        supported = ", ".join(sorted(type_name(t) for t in SUPPORTED_TYPES))
        raise ValueError(
            f"GGUF file {gguf_path} uses block types radixserve cannot read: {found}; "
            f"supported: {supported}"
        )


def _read_string(reader: object, key: str, gguf_path: Path) -> str:
    field = reader.fields.get(key)  # type: ignore[attr-defined]
    if field is None:
        raise ValueError(f"GGUF file {gguf_path} has no {key} metadata")
    return str(field.contents())


def _write_config(reader: object, arch: str, gguf_path: Path, out_dir: Path) -> object:
    from transformers import AutoConfig

    try:
        if arch in _OWN_CONFIG_ARCHITECTURES:
            from radixserve.models.gguf_config import own_config

            config = own_config(reader, arch)
        else:
            config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    except Exception as e:
        raise ValueError(f"cannot read the model config from GGUF file {gguf_path}: {e}") from e
    if arch == "llama":
        from radixserve.models.gguf_config import mixtral_config

        config = mixtral_config(reader, config) or config
    hf_arch = _HF_ARCHITECTURES.get(config.model_type)
    if hf_arch is None:
        raise ValueError(f"GGUF file {gguf_path}: unsupported model type {config.model_type!r}")
    config.architectures = [hf_arch]
    # transformers does not map the per-head size; without it Qwen3 falls back to a default.
    key_length = reader.fields.get(f"{arch}.attention.key_length")  # type: ignore[attr-defined]
    # (DeepSeek-V2's key_length is MLA's cached row or q/k head; its config sets head_dim.)
    if key_length is not None and arch != "deepseek2":
        config.head_dim = int(key_length.contents())
    if arch in _GEMMA_ARCHITECTURES:
        from radixserve.models.gguf_config import fill_gemma_config

        fill_gemma_config(reader, arch, config)
    if arch in _MOE_ARCHITECTURES:
        from radixserve.models.gguf_config import fill_moe_config

        fill_moe_config(reader, arch, config)
    config.save_pretrained(out_dir)
    return config


def _write_tokenizer(gguf_path: Path, out_dir: Path, arch: str) -> None:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    # AutoTokenizer reads the model config first, which transformers cannot for some
    # architectures; the fast tokenizer reads only the file's tokenizer metadata.
    loader = PreTrainedTokenizerFast if arch in _OWN_CONFIG_ARCHITECTURES else AutoTokenizer
    try:
        tokenizer = loader.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    except Exception as e:
        raise ValueError(f"cannot read the tokenizer from GGUF file {gguf_path}: {e}") from e
    tokenizer.save_pretrained(out_dir)


def gguf_architecture(model_type: str) -> str:
    """The general.architecture llama.cpp writes for an HF model_type."""
    return _GGUF_ARCHITECTURE_OF.get(model_type, model_type)


def hf_tensor_name(gguf_name: str, arch: str = "llama") -> str | None:
    """The HF name of a GGUF tensor of a file of general.architecture `arch`; None for tensors
    we derive ourselves."""
    base, _, suffix = gguf_name.rpartition(".")
    if suffix not in ("weight", "bias") or not base:
        raise ValueError(f"unexpected GGUF tensor name {gguf_name!r}")
    if base in _IGNORED_NAMES:
        return None
    if base in _TOP_LEVEL_NAMES:
        return f"{_TOP_LEVEL_NAMES[base]}.{suffix}"
    names = _BLOCK_NAMES_OF.get(arch, _BLOCK_NAMES)
    match = _BLOCK_RE.match(base)
    if match and match.group(2) in names:
        module = names[match.group(2)]
        if module.endswith(".sinks"):  # a bare parameter in transformers (gpt-oss)
            return f"model.layers.{match.group(1)}.{module}"
        return f"model.layers.{match.group(1)}.{module}.{suffix}"
    expert = _OLD_EXPERT_RE.match(match.group(2)) if match else None
    if match and expert:
        proj = _OLD_EXPERT_NAMES[expert.group(1)]
        return f"model.layers.{match.group(1)}.mlp.experts.{expert.group(2)}.{proj}.{suffix}"
    raise ValueError(f"unknown GGUF tensor name {gguf_name!r}")


def hf_float_value(arch: str, hf_name: str, value: torch.Tensor) -> torch.Tensor:
    """A float tensor as the HF checkpoint holds it: Gemma's norm weights lose the one that
    llama.cpp's converter added (as transformers' GGUF loader takes it off); a shared-expert gate
    stored as a vector gets its row back."""
    if arch in _NORMS_PLUS_ONE and hf_name.endswith("norm.weight"):
        return value - 1
    if hf_name.endswith("shared_expert_gate.weight") and value.dim() == 1:
        return value.reshape(1, -1)  # llama.cpp stores Qwen2-MoE's [1, hidden] gate as a vector
    return value


def unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's per-head row order for q/k (it interleaves the two rotary halves).

    llama.cpp's converter lays each head's rows out as (half, pair, ...) -> (pair, half, ...);
    swapping the two axes back restores the HF order. Works for weights and biases.
    """
    rows = weight.shape[0]
    if rows % (2 * num_heads):
        raise ValueError(f"cannot unpermute {rows} rows over {num_heads} heads")
    per_half = rows // num_heads // 2
    grouped = weight.reshape(num_heads, per_half, 2, *weight.shape[1:])
    return grouped.swapaxes(1, 2).reshape(weight.shape)


def _dequantize(tensor: object) -> torch.Tensor:
    import torch
    from gguf import GGMLQuantizationType, dequantize

    qtype = tensor.tensor_type  # type: ignore[attr-defined]
    data = dequantize(tensor.data, qtype)  # type: ignore[attr-defined]
    # Always copy: the reader's arrays are read-only views of a memory-mapped file.
    target = np.float16 if qtype == GGMLQuantizationType.F16 else np.float32
    return torch.from_numpy(np.array(data, dtype=target, order="C", copy=True))


def _write_tensors(
    reader: object,
    gguf_path: Path,
    out_dir: Path,
    arch: str,
    qk_heads: tuple[int, int] | None,
    mmproj: Path | None = None,
) -> None:
    """Dequantise tensor by tensor into ~2 GiB safetensors shards, flushed as they fill (with
    an mmproj file's vision tensors after the language model's)."""
    import torch

    writer = _ShardWriter(out_dir)
    tensors = reader.tensors  # type: ignore[attr-defined]
    for tensor in tqdm(tensors, desc=f"Converting {gguf_path.name}", unit="tensor"):
        try:
            name = hf_tensor_name(tensor.name, arch)
            if name is None:
                continue
            value = hf_float_value(arch, name, _dequantize(tensor))
        except Exception as e:
            raise ValueError(f"cannot convert tensor {tensor.name} of {gguf_path}: {e}") from e
        if qk_heads is not None and (".q_proj." in name or ".k_proj." in name):
            heads = qk_heads[0] if ".q_proj." in name else qk_heads[1]
            value = torch.from_numpy(np.ascontiguousarray(unpermute_qk(value.numpy(), heads)))
        writer.add(name, value)
    if mmproj is not None:
        from radixserve.models.gguf_mmproj import vision_tensors

        for name, value in vision_tensors(mmproj):
            writer.add(name, value)
    writer.close()


class _ShardWriter:
    """Writes model.safetensors, or model-NNNNN.safetensors shards plus the index."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.weight_map: dict[str, str] = {}
        self.total_bytes = 0
        self.num_written = 0

    def add(self, name: str, value: torch.Tensor) -> None:
        if self.pending and self.pending_bytes + value.nbytes > SHARD_BYTES:
            self._flush(f"model-{self.num_written + 1:05d}.safetensors")
        self.pending[name] = value
        self.pending_bytes += value.nbytes

    def _flush(self, file_name: str) -> None:
        from safetensors.torch import save_file

        save_file(self.pending, str(self.out_dir / file_name), metadata={"format": "pt"})
        for name, value in self.pending.items():
            self.weight_map[name] = file_name
            self.total_bytes += value.nbytes
        self.pending, self.pending_bytes = {}, 0
        self.num_written += 1

    def close(self) -> None:
        if self.num_written == 0:
            self._flush("model.safetensors")
            return
        if self.pending:
            self._flush(f"model-{self.num_written + 1:05d}.safetensors")
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": self.weight_map}
        text = json.dumps(index, indent=2) + "\n"
        (self.out_dir / "model.safetensors.index.json").write_text(text)
