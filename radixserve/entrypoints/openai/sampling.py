"""OpenAI request fields -> the engine's `sampling_params` dict (SGLang's mapping).

None means "not given": the key is left out so the engine's default applies, except
`max_new_tokens`, where None means "up to the context length".
"""

from __future__ import annotations

import json
from typing import Any

from radixserve.entrypoints.openai.errors import ApiError
from radixserve.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ResponseFormat,
    SamplingExtensions,
)
from radixserve.parsers.tool_choice import ToolChoiceError, forced_tool_schema, resolve_tool_choice

# Plain copies: request field -> sampling parameter.
_COMMON = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_new_tokens",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "stop_regex": "stop_regex",
    "seed": "sampling_seed",
    "logit_bias": "logit_bias",
    "regex": "regex",
    "ebnf": "ebnf",
    "json_schema": "json_schema",
    "custom_params": "custom_params",
}
_FLAGS = ("no_stop_trim", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens")

# Engine parameter names -> the names an OpenAI client used, for error messages.
COMPLETION_PARAM_NAMES = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "sampling_seed": "seed",
    "text": "prompt",
    "input_ids": "prompt",
}
CHAT_PARAM_NAMES = {**COMPLETION_PARAM_NAMES, "text": "messages", "input_ids": "messages"}


def _common(req: SamplingExtensions, max_new_tokens: int | None) -> dict[str, Any]:
    params: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    for field, name in _COMMON.items():
        value = getattr(req, field, None)
        if value is not None:
            params[name] = value
    for flag in _FLAGS:
        params[flag] = getattr(req, flag)
    return params


def completion_sampling_params(req: CompletionRequest) -> dict[str, Any]:
    return _common(req, req.max_tokens)


def chat_sampling_params(req: ChatCompletionRequest) -> dict[str, Any]:
    max_new = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    params = _common(req, max_new)
    if req.response_format is not None:
        params.update(_response_format(req.response_format))
    params.update(_tool_constraint(req))
    return params


def _tool_constraint(req: ChatCompletionRequest) -> dict[str, Any]:
    """tool_choice "required" or a named function: a JSON schema makes the reply parse."""
    try:
        choice = resolve_tool_choice(req.tool_choice, req.tools)
        if choice in ("none", "auto"):
            return {}
        schema = forced_tool_schema(req.tools or [], choice, req.parallel_tool_calls is not False)
    except ToolChoiceError as exc:
        raise ApiError(400, str(exc), param=exc.param) from exc
    has_format = req.response_format is not None and req.response_format.type != "text"
    if has_format or req.regex or req.ebnf or req.json_schema:
        raise ApiError(
            400,
            "tool_choice 'required' or a named function cannot be combined with another "
            "output constraint (response_format, regex, ebnf, json_schema).",
            param="tool_choice",
        )
    return {"json_schema": json.dumps(schema)}


def chat_param_names(req: ChatCompletionRequest) -> dict[str, str]:
    names = dict(CHAT_PARAM_NAMES)
    if req.max_completion_tokens is not None:
        names["max_new_tokens"] = "max_completion_tokens"
    return names


def _response_format(fmt: ResponseFormat) -> dict[str, Any]:
    if fmt.type == "text":
        return {}
    if fmt.type == "json_object":
        return {"json_schema": '{"type": "object"}'}
    if fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise ApiError(
                400,
                "response_format.json_schema.schema is required when type is 'json_schema'.",
                param="response_format.json_schema",
            )
        return {"json_schema": json.dumps(fmt.json_schema.schema_)}
    extra = fmt.model_extra or {}
    return {"structural_tag": json.dumps({k: v for k, v in extra.items()} | {"type": fmt.type})}
