"""Request-body entries for /openapi.json.

The routes read their bodies themselves (request_body.py: size limit, content type, strict JSON,
then pydantic), so FastAPI cannot see the body models. `body_doc(Model)` gives the
`openapi_extra` that documents them anyway, so clients, /docs and the schema fuzz test
(tests/unit/test_http_schema_fuzz.py) see every field.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from pydantic import BaseModel, TypeAdapter

from radixserve.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    GenerateReqInput,
    TokenizeRequest,
)
from radixserve.sampling.sampling_params import SamplingParams

_LOCAL_REF = "#/$defs/"


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    # pydantic's "$defs" refs are relative to the model's own schema; inside the OpenAPI
    # document they would dangle, so each one is replaced by its (non-recursive) definition.
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(_LOCAL_REF):
            return _inline(defs[ref.removeprefix(_LOCAL_REF)], defs)
        return {key: _inline(value, defs) for key, value in node.items() if key != "$defs"}
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    return node


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema of `model` (validation mode) with no `$ref` left in it (a copy: callers
    edit it). Computed once per model: pydantic's schemas are ~65 ms of building the app, which
    the server does once the model is loaded; the HTTP stack's import warms them before."""
    return copy.deepcopy(_body_schema(model))


@functools.cache
def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(mode="validation")
    return _inline(schema, schema.get("$defs", {}))


def sampling_params_schema() -> dict[str, Any]:
    """/generate's `sampling_params` object: SamplingParams' fields (plus the `seed` alias),
    nothing else, since from_dict refuses unknown keys."""
    return copy.deepcopy(_sampling_params_schema())


@functools.cache
def _sampling_params_schema() -> dict[str, Any]:
    schema = _inline(TypeAdapter(SamplingParams).json_schema(), {})
    schema["properties"]["seed"] = {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    schema["additionalProperties"] = False
    return schema


def body_doc(model: type[BaseModel], *, properties: dict[str, Any] | None = None) -> dict[str, Any]:
    """`openapi_extra` for a route whose JSON body is `model`; `properties` replaces the
    schemas of the fields it names (for fields the model types loosely, as `dict[str, Any]`)."""
    schema = body_schema(model)
    schema["properties"].update(properties or {})
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": schema}},
        }
    }


def generate_body_doc() -> dict[str, Any]:
    """/generate: one sampling_params object, or one per prompt."""
    params = sampling_params_schema()
    one_or_many = {"anyOf": [params, {"type": "array", "items": params}, {"type": "null"}]}
    return body_doc(GenerateReqInput, properties={"sampling_params": one_or_many})


def tokenize_body_doc() -> dict[str, Any]:
    """/v1/tokenize: a `prompt` (TokenizeRequest), or chat `messages` read as a chat
    completion's (its fields, plus add_generation_prompt), never both."""
    plain = body_schema(TokenizeRequest)
    chat = body_schema(ChatCompletionRequest)
    chat["properties"]["add_generation_prompt"] = {"type": "boolean", "default": True}
    chat["not"] = {"required": ["prompt"]}
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"oneOf": [plain, chat]}}},
        }
    }
