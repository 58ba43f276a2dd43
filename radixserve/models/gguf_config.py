"""The config fields transformers' GGUF reader leaves out (Qwen2/3-MoE's expert sizes:
fill_moe_config; Mixtral and OLMoE, which it does not read: mixtral_config, olmoe_config; and
the Gemma 2/3 ones below), filled from the file's
metadata as llama.cpp reads it (llama-model.cpp), so the converted config.json describes the
model llama.cpp runs from the same file:

- attention and final logit soft-capping (`<arch>.attn_logit_softcapping`,
  `<arch>.final_logit_softcapping`; Gemma 3 soft-caps no attention scores);
- query_pre_attn_scalar, which GGUF does not store: llama.cpp scales scores by
  (hidden_size / heads) ** -0.5 for the 27B models (known by their layer count) and by
  head_dim ** -0.5 otherwise, which is what every released Gemma 2/3 config says;
- which layers slide (`<arch>.attention.sliding_window_pattern` where present, else every
  other layer for Gemma 2 and five of six for Gemma 3; none without a window);
- Gemma 3's RoPE: linear scaling of the global layers (`<arch>.rope.scaling.*`), and the
  sliding layers' base (`<arch>.rope.freq_base_swa`, else llama.cpp's fixed 10000).

And the turn's end as a stop token (gemma_stop_ids): instruction-tuned Gemma ends its turns
with <end_of_turn>, which its safetensors checkpoints list in generation_config.json and
llama.cpp stops at by its name, while a GGUF's eos_token_id is usually <eos>.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

SLIDING, FULL = "sliding_attention", "full_attention"
# llama.cpp's layer counts of the 27B models, the only ones whose query_pre_attn_scalar is
# hidden_size / heads rather than head_dim.
_LARGE_MODEL_LAYERS = {"gemma2": 46, "gemma3": 62}
# Without a pattern in the file: every `period`-th layer is global (llama.cpp's set_swa_pattern).
_DEFAULT_PERIOD = {"gemma2": 2, "gemma3": 6}
LOCAL_ROPE_THETA = 10000.0


def _value(reader: object, key: str) -> Any:
    field = reader.fields.get(key)  # type: ignore[attr-defined]
    return None if field is None else field.contents()


def arch_key(reader: object, arch: str) -> Callable[..., Any]:
    """key(name, default=None): the file's `<arch>.<name>` value, else `default`; a missing key
    without a default is a ValueError naming it (for configs built from the metadata alone)."""

    def key(name: str, default: Any = None) -> Any:
        value = _value(reader, f"{arch}.{name}")
        if value is None and default is None:
            raise ValueError(f"this {arch} GGUF lacks the key {arch}.{name}")
        return default if value is None else value

    return key


def special_token_ids(reader: object) -> dict[str, Any]:
    """bos/eos/pad token ids from the tokenizer.ggml.* keys (None where absent), as config
    keyword arguments."""
    return {
        name: _value(reader, f"tokenizer.ggml.{key_name}")
        for name, key_name in (
            ("bos_token_id", "bos_token_id"),
            ("eos_token_id", "eos_token_id"),
            ("pad_token_id", "padding_token_id"),
        )
    }


def fill_gemma_config(reader: object, arch: str, config: Any) -> None:
    """Set the fields above on `config` (transformers' config read from the same file)."""
    if arch == "gemma2":
        cap = _value(reader, f"{arch}.attn_logit_softcapping")
        if cap is not None:
            config.attn_logit_softcapping = float(cap)
    final_cap = _value(reader, f"{arch}.final_logit_softcapping")
    if final_cap is not None:
        config.final_logit_softcapping = float(final_cap)
    large = config.num_hidden_layers == _LARGE_MODEL_LAYERS[arch]
    heads = config.num_attention_heads
    config.query_pre_attn_scalar = config.hidden_size // heads if large else config.head_dim
    if _value(reader, f"{arch}.attention.sliding_window") is None:
        # llama.cpp's converter writes no window when no layer slides.
        config.sliding_window = None
        config.layer_types = [FULL] * config.num_hidden_layers
    else:
        config.layer_types = _layer_types(reader, arch, config.num_hidden_layers)
    _fill_rope(reader, arch, config)


def _layer_types(reader: object, arch: str, count: int) -> list[str]:
    pattern = _value(reader, f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):  # one flag per layer, true where it slides
        if len(pattern) != count:
            raise ValueError(f"sliding_window_pattern has {len(pattern)} flags for {count} layers")
        return [SLIDING if flag else FULL for flag in pattern]
    period = int(pattern or _DEFAULT_PERIOD[arch])
    return [SLIDING if i % period < period - 1 else FULL for i in range(count)]


def _fill_rope(reader: object, arch: str, config: Any) -> None:
    params = config.rope_parameters
    per_type = isinstance(params.get(FULL), dict)  # transformers >= 5's Gemma 3
    global_params = params[FULL] if per_type else params
    scaling = _value(reader, f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        if scaling != "linear":
            raise ValueError(f"GGUF rope scaling {scaling!r} of a {arch} model is not supported")
        factor = float(_value(reader, f"{arch}.rope.scaling.factor"))
        global_params.update(rope_type="linear", factor=factor)
    if per_type:
        local = _value(reader, f"{arch}.rope.freq_base_swa")
        params[SLIDING]["rope_theta"] = LOCAL_ROPE_THETA if local is None else float(local)


def fill_moe_config(reader: object, arch: str, config: Any) -> None:
    """The expert sizes transformers' GGUF reader leaves out of a Qwen2/3-MoE config
    (`<arch>.expert_feed_forward_length`, `<arch>.expert_shared_feed_forward_length`); every
    layer of such a file is sparse, as llama.cpp builds it."""
    size = _value(reader, f"{arch}.expert_feed_forward_length")
    if size is None:
        raise ValueError(f"a {arch} GGUF needs {arch}.expert_feed_forward_length")
    config.moe_intermediate_size = int(size)
    shared = _value(reader, f"{arch}.expert_shared_feed_forward_length")
    if shared is None:  # older files: the shared expert's own rows say it
        shared = _shared_expert_rows(reader)
    if shared is not None:
        config.shared_expert_intermediate_size = int(shared)
    config.decoder_sparse_step = 1
    config.mlp_only_layers = []


# The LlamaConfig fields transformers' GGUF reader fills that a Mixtral config keeps.
_MIXTRAL_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "max_position_embeddings",
    "rms_norm_eps",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "tie_word_embeddings",
    "rope_parameters",
)


def mixtral_config(reader: object, config: Any) -> Any | None:
    """A Mixtral config for a llama GGUF with experts (llama.cpp stores Mixtral as llama with
    llama.expert_count; its feed_forward_length is the experts' size), else None."""
    experts = _value(reader, "llama.expert_count")
    if not experts:
        return None
    from transformers import MixtralConfig

    fields = {k: getattr(config, k) for k in _MIXTRAL_FIELDS if hasattr(config, k)}
    return MixtralConfig(
        **fields,
        num_local_experts=int(experts),
        num_experts_per_tok=int(_value(reader, "llama.expert_used_count")),
        sliding_window=None,  # llama.cpp runs Mixtral without one
    )


def olmoe_config(reader: object) -> Any:
    """An OLMoE config from an `olmoe` GGUF's metadata (transformers' GGUF readers have no
    OLMoE), with llama.cpp's reading: every layer sparse, the top-k not renormalized, q/k
    normed over the whole projection; the experts' size is expert_feed_forward_length where
    the file has it, else feed_forward_length (what llama.cpp's converter writes)."""
    from transformers import OlmoeConfig

    key = arch_key(reader, "olmoe")

    heads = int(key("attention.head_count"))
    tokens = reader.fields.get("tokenizer.ggml.tokens")  # type: ignore[attr-defined]
    names = {t.name for t in reader.tensors}  # type: ignore[attr-defined]
    expert_size = _value(reader, "olmoe.expert_feed_forward_length")
    ids = special_token_ids(reader)
    clamp = _value(reader, "olmoe.attention.clamp_kqv")
    return OlmoeConfig(
        vocab_size=len(tokens.data) if tokens is not None else int(key("vocab_size")),
        hidden_size=int(key("embedding_length")),
        intermediate_size=int(expert_size or key("feed_forward_length")),
        num_hidden_layers=int(key("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(key("attention.head_count_kv", heads)),
        max_position_embeddings=int(key("context_length")),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        rope_parameters={"rope_type": "default", "rope_theta": float(key("rope.freq_base"))},
        num_experts=int(key("expert_count")),
        num_experts_per_tok=int(key("expert_used_count")),
        norm_topk_prob=False,
        clip_qkv=None if clamp is None else float(clamp),
        tie_word_embeddings="output.weight" not in names,
        **{name: None if value is None else int(value) for name, value in ids.items()},
    )


def _shared_expert_rows(reader: object) -> int | None:
    for tensor in reader.tensors:  # type: ignore[attr-defined]
        if tensor.name == "blk.0.ffn_gate_shexp.weight":
            return int(tensor.shape[1])  # GGUF lists dims fastest first: [hidden, rows]
    return None


END_OF_TURN = b"<end_of_turn>"


def gemma_stop_ids(reader: object) -> list[int]:
    """The file's eos token and its end-of-turn token (tokenizer.ggml.eot_token_id, else the
    vocabulary's <end_of_turn>), the ids a Gemma chat model stops at."""
    ids: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
        value = _value(reader, key)
        if value is not None and int(value) not in ids:
            ids.append(int(value))
    if _value(reader, "tokenizer.ggml.eot_token_id") is None:
        tokens = reader.fields.get("tokenizer.ggml.tokens")  # type: ignore[attr-defined]
        # The raw parts, not contents(): a real vocabulary has 262k tokens.
        for i, part in enumerate(tokens.data if tokens is not None else ()):
            if bytes(tokens.parts[part]) == END_OF_TURN:
                ids.append(i)
                break
    return ids


def gpt_oss_config(reader: object) -> Any:
    """A gpt-oss config from a `gpt-oss` GGUF's metadata, as llama.cpp reads the file: every
    other layer sliding from layer 0 (its swa pattern of 2), the experts' size
    expert_feed_forward_length, YaRN from rope.scaling.*. What GGUF does not store is
    transformers' gpt-oss default (swiglu alpha 1.702 and limit 7.0, YaRN betas 32 and 1
    without truncating the correction range: the original model's RoPE)."""
    from transformers import GptOssConfig

    key = arch_key(reader, "gpt-oss")

    heads = int(key("attention.head_count"))
    layers = int(key("block_count"))
    tokens = reader.fields.get("tokenizer.ggml.tokens")  # type: ignore[attr-defined]
    names = {t.name for t in reader.tensors}  # type: ignore[attr-defined]
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(key("rope.freq_base"))}
    if _value(reader, "gpt-oss.rope.scaling.type") == "yarn":
        rope.update(
            rope_type="yarn",
            factor=float(key("rope.scaling.factor")),
            original_max_position_embeddings=int(key("rope.scaling.original_context_length")),
            beta_fast=32.0,
            beta_slow=1.0,
            truncate=False,
        )
    window = _value(reader, "gpt-oss.attention.sliding_window")
    ids = special_token_ids(reader)
    return GptOssConfig(
        vocab_size=len(tokens.data) if tokens is not None else int(key("vocab_size")),
        hidden_size=int(key("embedding_length")),
        intermediate_size=int(key("expert_feed_forward_length", key("feed_forward_length", 0))),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=int(key("attention.head_count_kv", heads)),
        head_dim=int(key("attention.key_length")),
        max_position_embeddings=int(key("context_length")),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        rope_parameters=rope,
        sliding_window=None if window is None else int(window),
        layer_types=[SLIDING if i % 2 == 0 else FULL for i in range(layers)],
        num_local_experts=int(key("expert_count")),
        num_experts_per_tok=int(key("expert_used_count")),
        attention_bias="blk.0.attn_q.bias" in names,
        tie_word_embeddings="output.weight" not in names,
        **{name: None if value is None else int(value) for name, value in ids.items()},
    )


def own_config(reader: object, arch: str) -> Any:
    """The config of a GGUF architecture transformers' readers do not know."""
    if arch == "gpt-oss":
        return gpt_oss_config(reader)
    if arch == "deepseek2":
        from radixserve.models.gguf_deepseek2 import deepseek2_config

        return deepseek2_config(reader)
    return olmoe_config(reader)
