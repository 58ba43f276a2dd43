"""The model's Hugging Face config, normalised once: the only place HF config quirks live."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from radixserve.utils import env_flag
from radixserve.utils.auto_dtype import cpu_auto_dtype

logger = logging.getLogger(__name__)

ALLOW_LONGER_CONTEXT_ENV = "RADIXSERVE_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"

# Checked in this order: some configs carry several and the first one is the real limit.
_CONTEXT_LENGTH_KEYS = (
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
    "max_position_embeddings",
)

_DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "float": torch.float32,
}


def resolve_dtype(dtype: str | torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    """--dtype -> torch dtype. "auto": bfloat16 where the hardware computes it natively (a CPU
    with AVX512-BF16/AMX-BF16 where it measured faster, a CUDA device with bf16), else float32 on
    CPU, float16 on CUDA."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"--dtype {dtype} is not supported")
        return dtype
    name = dtype.strip().lower()
    if name in _DTYPES:
        return _DTYPES[name]
    if name != "auto":
        choices = ", ".join(["auto", *_DTYPES])
        raise ValueError(f"--dtype {dtype!r} is not supported; choose one of: {choices}")
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_auto_dtype().dtype == "bfloat16" else torch.float32


@dataclass(frozen=True)
class ModelConfig:
    """Everything the model code and the memory planner read from the checkpoint's config.

    `context_len` is the serving limit (after --context-length); `max_position_embeddings` is the
    model's own. `rope_scaling` is None for plain RoPE, else a dict with a "rope_type" key.
    RoPE turns the first `rotary_dim` dims of each head (`partial_rotary_factor` of head_dim,
    as Phi-4-mini sets it).
    """

    architectures: tuple[str, ...]
    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Mapping[str, Any] | None
    max_position_embeddings: int
    context_len: int
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    hidden_act: str
    eos_token_ids: tuple[int, ...]
    dtype: torch.dtype
    hf_config: Any = field(compare=False, repr=False)
    partial_rotary_factor: float = 1.0

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        *,
        context_length: int | None = None,
        dtype: str | torch.dtype = "auto",
        revision: str | None = None,
        trust_remote_code: bool = False,
        json_model_override_args: str = "{}",
        device: str | torch.device = "cpu",
    ) -> ModelConfig:
        """Read config.json from a model folder (a .gguf is converted first, see models.gguf)."""
        source = _config_source(path)
        hf_config = _load_hf_config(source, revision, trust_remote_code)
        base_theta = _rope_params(hf_config, None)[0]
        overrides = _parse_overrides(json_model_override_args)
        if overrides:
            hf_config.update(overrides)
            logger.info("Model config overridden with %s", overrides)
        return cls.from_hf_config(
            hf_config,
            context_length=context_length,
            dtype=resolve_dtype(dtype, device),
            rope_theta_fallback=base_theta,
            generation_eos=_generation_eos(source),
        )

    @classmethod
    def from_hf_config(
        cls,
        hf_config: Any,
        *,
        context_length: int | None = None,
        dtype: torch.dtype = torch.float32,
        rope_theta_fallback: float | None = None,
        generation_eos: tuple[int, ...] = (),
    ) -> ModelConfig:
        """Normalise an in-memory transformers config (used directly by tests)."""
        hf = hf_config
        text = _vision_language_text_config(hf)
        if text is not None:
            # The language model's numbers; the model keeps the whole config (its vision part).
            inner = cls.from_hf_config(
                text,
                context_length=context_length,
                dtype=dtype,
                rope_theta_fallback=rope_theta_fallback,
                generation_eos=generation_eos,
            )
            return dataclasses.replace(
                inner,
                architectures=tuple(getattr(hf, "architectures", None) or ()),
                model_type=str(getattr(hf, "model_type", "")),
                hf_config=hf,
            )
        architectures = tuple(getattr(hf, "architectures", None) or ())
        num_heads = int(hf.num_attention_heads)
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // num_heads
        rope_theta, rope_scaling = _rope_params(hf, rope_theta_fallback)
        # A per-layer-type table (transformers 5's Gemma 3) has no top-level factor, so, as
        # SGLang reads it, no factor stretches max_position_embeddings (Gemma 3's already
        # counts the linear scaling of its full-attention layers).
        derived_len = derive_context_length(hf, None if _per_layer_type_rope(hf) else rope_scaling)
        if (
            getattr(hf, "use_sliding_window", False)
            and not getattr(hf, "layer_types", None)  # per-layer windows: models/llama.py
            and not _always_sliding_window(hf, derived_len)
        ):
            logger.warning(
                "The model config asks for sliding-window attention; radixserve attends over the "
                "full context, so outputs past the window (%s tokens) can differ",
                getattr(hf, "sliding_window", None),
            )
        return cls(
            architectures=architectures,
            model_type=str(getattr(hf, "model_type", "")),
            vocab_size=int(hf.vocab_size),
            hidden_size=int(hf.hidden_size),
            num_hidden_layers=int(hf.num_hidden_layers),
            num_attention_heads=num_heads,
            num_key_value_heads=int(getattr(hf, "num_key_value_heads", None) or num_heads),
            head_dim=int(head_dim),
            intermediate_size=int(hf.intermediate_size),
            rms_norm_eps=float(getattr(hf, "rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            max_position_embeddings=int(
                getattr(hf, "max_position_embeddings", None) or derived_len
            ),
            context_len=_serving_context_len(context_length, derived_len),
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            # Qwen2 configs have no attention_bias flag, yet their q/k/v projections have biases.
            attention_bias=bool(getattr(hf, "attention_bias", False))
            or str(getattr(hf, "model_type", "")) == "qwen2",
            mlp_bias=bool(getattr(hf, "mlp_bias", False)),
            # transformers' Gemma 2/3 read hidden_activation (their configs may keep a
            # hidden_act as well, for older code).
            hidden_act=str(
                getattr(hf, "hidden_activation", None) or getattr(hf, "hidden_act", "silu")
            ),
            eos_token_ids=_eos_ids(getattr(hf, "eos_token_id", None), generation_eos),
            dtype=dtype,
            hf_config=hf,
            partial_rotary_factor=_partial_rotary_factor(hf),
        )


# Vision-language configs whose language model's fields sit in `text_config`.
_VISION_LANGUAGE_TYPES = (
    "llava",
    "llava_next",
    "llava_onevision",
    "gemma3",
    "idefics3",
    "smolvlm",
    "qwen2_vl",
    "qwen2_5_vl",
)


def _vision_language_text_config(hf_config: Any) -> Any:
    if str(getattr(hf_config, "model_type", "")) not in _VISION_LANGUAGE_TYPES:
        return None
    return getattr(hf_config, "text_config", None)


def derive_context_length(hf_config: Any, rope_scaling: Mapping[str, Any] | None) -> int:
    """The model's own context limit, as SGLang derives it."""
    factor = 1.0
    if rope_scaling:
        factor = float(rope_scaling.get("factor", 1.0) or 1.0)
        # These rope types stretch a base length that max_position_embeddings already includes.
        if "original_max_position_embeddings" in rope_scaling or (
            rope_scaling.get("rope_type") == "llama3"
        ):
            factor = 1.0
    for key in _CONTEXT_LENGTH_KEYS:
        value = getattr(hf_config, key, None)
        if value is not None:
            return int(factor * value)
    return 2048


def _serving_context_len(requested: int | None, derived: int) -> int:
    if requested is None:
        return derived
    if requested <= 0:
        raise ValueError(f"--context-length must be positive, got {requested}")
    if requested > derived:
        msg = (
            f"--context-length ({requested}) is greater than the model's derived context length "
            f"({derived}); outputs past it may be wrong."
        )
        if not env_flag(ALLOW_LONGER_CONTEXT_ENV):
            raise ValueError(f"{msg} To allow this, set {ALLOW_LONGER_CONTEXT_ENV}=1")
        logger.warning(msg)
    return requested


# transformers >= 5 keys RoPE parameters by layer type where they differ (Gemma 3); the
# full-attention layers' are the model's RoPE.
_GLOBAL_LAYER_TYPE = "full_attention"


def _per_layer_type_rope(hf_config: Any) -> bool:
    params = getattr(hf_config, "rope_parameters", None) or {}
    return isinstance(params.get(_GLOBAL_LAYER_TYPE), Mapping)


def layer_type_rope(hf_config: Any, layer_type: str) -> tuple[float, dict[str, Any] | None] | None:
    """(rope_theta, rope_scaling) of the layers of `layer_type` ("sliding_attention",
    "full_attention") where the config keys RoPE by layer type, else None."""
    if not _per_layer_type_rope(hf_config):
        return None
    params = hf_config.rope_parameters.get(layer_type)
    if not isinstance(params, Mapping):
        return None
    return _normalised_rope(hf_config, dict(params), None)


def _rope_params(
    hf_config: Any, theta_fallback: float | None
) -> tuple[float, dict[str, Any] | None]:
    # transformers >= 5 keeps rope_theta inside rope_parameters; older versions use rope_theta
    # plus rope_scaling (with "type" or "rope_type").
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None)
    params = dict(params or {})
    if isinstance(params.get(_GLOBAL_LAYER_TYPE), Mapping):
        params = dict(params[_GLOBAL_LAYER_TYPE])
    return _normalised_rope(hf_config, params, theta_fallback)


def _normalised_rope(
    hf_config: Any, params: dict[str, Any], theta_fallback: float | None
) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from one set of RoPE parameters (consumed)."""
    theta = params.pop("rope_theta", None) or getattr(hf_config, "rope_theta", None)
    theta = float(theta or theta_fallback or 10000.0)
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    # How much of each head rotates is not a scaling of the frequencies (see rotary_dim).
    params.pop("partial_rotary_factor", None)
    if rope_type == "su":  # LongRoPE's name in early Phi-3 configs
        rope_type = "longrope"
    if rope_type == "default":
        return theta, None
    if rope_type == "longrope":
        # Phi-3 keeps the pretraining length beside rope_scaling, and it wins (as in
        # transformers); transformers >= 5 copies it in, older versions leave it outside.
        original = getattr(hf_config, "original_max_position_embeddings", None)
        params["original_max_position_embeddings"] = int(
            original
            or params.get("original_max_position_embeddings")
            or hf_config.max_position_embeddings
        )
    return theta, {"rope_type": rope_type, **params}


def _partial_rotary_factor(hf_config: Any) -> float:
    # transformers >= 5 moves it into rope_parameters; older versions keep the attribute.
    params = getattr(hf_config, "rope_parameters", None) or {}
    factor = params.get("partial_rotary_factor") or getattr(
        hf_config, "partial_rotary_factor", None
    )
    return float(factor or 1.0)


# Model types whose reference implementation applies `sliding_window` whenever it is set (no
# use_sliding_window switch).
_WINDOW_WHEN_SET = ("mistral", "phi3", "mixtral")


def reference_sliding_window(hf_config: Any, context_len: int) -> int | None:
    """The sliding window transformers applies to every layer of a Mistral, Mixtral or Phi-3 model
    (keys a token sees, its own included), or None where it masks nothing."""
    if not _always_sliding_window(hf_config, context_len):
        return None
    return int(hf_config.sliding_window)


def _always_sliding_window(hf_config: Any, context_len: int) -> bool:
    window = getattr(hf_config, "sliding_window", None)
    return (
        getattr(hf_config, "model_type", "") in _WINDOW_WHEN_SET
        and window is not None
        # A window as long as the context (Phi-4-mini's) never masks anything.
        and int(window) < context_len
    )


def _eos_ids(config_eos: Any, generation_eos: tuple[int, ...]) -> tuple[int, ...]:
    ids: set[int] = set(generation_eos)
    if isinstance(config_eos, int):
        ids.add(config_eos)
    elif config_eos:
        ids.update(int(i) for i in config_eos)
    return tuple(sorted(ids))


def _parse_overrides(text: str | Mapping[str, Any] | None) -> dict[str, Any]:
    if not text:
        return {}
    if isinstance(text, Mapping):
        return dict(text)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--json-model-override-args is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"--json-model-override-args must be a JSON object, got {text!r}")
    return value


def _config_source(path: str | os.PathLike[str]) -> str:
    """A local folder holding config.json, or a hub id; a GGUF is converted to a folder."""
    from radixserve.models.weight_utils import resolve_local_model

    text = os.fspath(path)
    local = Path(text).expanduser()
    if local.exists():
        return str(resolve_local_model(local, with_weights=False))
    if not looks_like_hub_id(text):
        raise FileNotFoundError(f"model path {text} does not exist")
    return text


def looks_like_hub_id(text: str) -> bool:
    """'org/name': not an absolute or relative filesystem path."""
    parts = text.split("/")
    return len(parts) == 2 and all(parts) and not text.startswith((".", "~"))


def _load_hf_config(source: str, revision: str | None, trust_remote_code: bool) -> Any:
    """AutoConfig's config of `source`; for a local folder read before, its remembered
    attributes instead (models/config_snapshot.py: no transformers import)."""
    from radixserve.models.config_snapshot import load_snapshot, save_snapshot

    local = revision is None and Path(source).is_dir()
    if local:
        snapshot = load_snapshot(source)
        if snapshot is not None:
            return snapshot
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(
            source, revision=revision, trust_remote_code=trust_remote_code
        )
    except ValueError as e:
        if not trust_remote_code and "trust_remote_code" in str(e):
            raise ValueError(
                f"the config of {source} needs custom code; pass --trust-remote-code to run it"
            ) from e
        raise ValueError(f"cannot read the model config of {source}: {e}") from e
    except OSError as e:
        raise FileNotFoundError(f"cannot read the model config of {source}: {e}") from e
    if local:
        save_snapshot(source, config)
    return config


def _generation_eos(source: str) -> tuple[int, ...]:
    path = Path(source) / "generation_config.json"
    if not path.is_file():
        return ()
    try:
        eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, json.JSONDecodeError) as e:
        logger.warning("Ignoring unreadable %s: %s", path, e)
        return ()
    if isinstance(eos, int):
        return (eos,)
    return tuple(int(i) for i in eos or ())
