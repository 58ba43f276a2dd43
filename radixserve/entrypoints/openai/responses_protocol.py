"""Request body of POST /v1/responses (OpenAI's Responses API, the fields this server serves).

Unlike the chat body, unknown fields are refused (400 naming the field): the Responses API has
many hosted features (background runs, conversations, hosted tools) that this server does not
run, and a client must not believe one took effect. Fields that are known but take only some
values here are checked in responses_input.py, which also maps the body onto a chat request.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from radixserve.entrypoints.openai.protocol import SamplingExtensions


class ResponsesTextFormat(BaseModel):
    """`text.format`: {"type": "text"} | {"type": "json_object"} |
    {"type": "json_schema", "name", "schema", "strict", "description"} (flat, unlike chat)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponsesText(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: ResponsesTextFormat | None = None
    # Only the default is served: no model here is trained for other verbosity levels.
    verbosity: Literal["medium"] | None = None


class ResponsesReasoning(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # Passed to the chat template as `reasoning_effort` (templates that know it use it).
    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesStreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # Obfuscation pads deltas against side channels over the public internet; this server adds
    # none, so false and true both describe what it sends.
    include_obfuscation: bool | None = None


class ResponsesRequest(SamplingExtensions):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: ResponsesText | None = None
    reasoning: ResponsesReasoning | None = None
    stream: bool = False
    stream_options: ResponsesStreamOptions | None = None
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    seed: int | None = None
    # Accepted with the values that mean "what this server does anyway"; others are refused.
    truncation: Literal["disabled"] | None = None
    background: Literal[False] | None = None
    service_tier: Literal["auto", "default"] | None = None
    include: list[str] | None = None
    top_logprobs: Literal[0] | None = None
    # Hints for hosted routing/caching; the radix cache shares prefixes without a key.
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    @field_validator("max_output_tokens")
    @classmethod
    def _max_output_tokens(cls, value: int | None) -> int | None:
        if value is not None and value <= 0:
            raise ValueError(f"max_output_tokens must be a positive integer, got {value}")
        return value

    @field_validator("input")
    @classmethod
    def _input(cls, value: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
        if isinstance(value, list) and not value:
            raise ValueError("input must contain at least one item")
        return value

    @field_validator("include")
    @classmethod
    def _include(cls, value: list[str] | None) -> list[str] | None:
        # Encrypted reasoning, hosted-tool results and logprobs are not produced here.
        if value:
            raise ValueError(f"include {value[0]!r} is not supported by this server")
        return value
