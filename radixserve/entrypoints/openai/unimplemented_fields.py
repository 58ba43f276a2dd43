"""SGLang request fields that change what a request does but that this server does not
implement: a request that sets one gets a 400 naming it, never a silent default.

Fields SGLang does not know stay ignored, as in SGLang (clients send extras such as `user`),
and so do SGLang's logging-only fields (`log_metrics`, `no_logs`, `custom_labels`,
`external_trace_header`, `received_time`), which change no response.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, model_validator

# Both the OpenAI routes and /generate.
_COMMON = (
    "return_hidden_states",
    "return_cached_tokens_details",
    "return_prompt_token_ids",
    "routed_dp_rank",
    "data_parallel_rank",
    "disagg_prefill_dp_rank",
    "extra_key",
    "cache_salt",
    "session_id",
    "bootstrap_pair_key",
    "decode_tp_size",
    "images_config",
    "max_dynamic_patch",
    "min_dynamic_patch",
    "use_audio_in_video",
)
GENERATE_FIELDS = (
    *_COMMON,
    "input_embeds",
    "video_data",
    "audio_data",
    "mm_hashes",
    "modalities",
    "return_sampling_mask",
    "return_indexer_topk",
    "return_entropy",
    "return_bytes",
    "routing_key",
    "conversation_id",
    "lora_id",
    "positional_embed_overrides",
    "background",
    "require_reasoning",
    "image_max_dynamic_patch",
    "video_max_dynamic_patch",
    "multi_item_delimiter_indices",
)
COMPLETION_FIELDS = (*_COMMON, "session_params", "custom_logit_processor")
CHAT_FIELDS = (*COMPLETION_FIELDS, "return_meta_info", "task", "input_ids")


def _is_set(value: Any) -> bool:
    """None, False and empty containers are the defaults a client may send back unchanged; 0
    is a real value (routed_dp_rank 0 asks for replica 0)."""
    return not (value is None or value is False or value in ("", [], {}))


def refuse_unimplemented(body: Any, fields: Iterable[str]) -> None:
    """Raise ValueError naming the first field of `fields` that `body` (a raw JSON object)
    sets."""
    if not isinstance(body, Mapping):
        return
    for name in fields:
        if name in body and _is_set(body[name]):
            raise ValueError(f"{name} is not supported by this server")


class RefusesUnimplementedFields(BaseModel):
    """A request body that refuses the SGLang fields in its `unimplemented_fields`."""

    unimplemented_fields: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _refuse_unimplemented(cls, body: Any) -> Any:
        refuse_unimplemented(body, cls.unimplemented_fields)
        return body
