"""Request bodies of the OpenAI-compatible and native routes (SGLang's field names).

Only shapes and simple ranges are checked here; sampling ranges are checked by the engine's
SamplingParams (one source of truth), and the serving code maps its parameter names back to
the names the client used. Unknown fields are ignored, as in SGLang; SGLang's own fields that
this server does not implement are refused (unimplemented_fields.py).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from radixserve.entrypoints.openai.unimplemented_fields import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    GENERATE_FIELDS,
    RefusesUnimplementedFields,
)
from radixserve.sampling.sampling_params import MAX_N

TokenIds = list[StrictInt]
# OpenAI caps top_logprobs at 20; we accept the same range for completions' `logprobs`.
MAX_TOP_LOGPROBS = 20
CHAT_ROLES = ("system", "user", "assistant", "tool", "function", "developer")


def _positive_or_none(name: str, value: int | None) -> int | None:
    if value is not None and value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return value


class StreamOptions(BaseModel):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class SamplingExtensions(RefusesUnimplementedFields):
    """SGLang's extra sampling fields (sent by the openai client through `extra_body`)."""

    top_k: int | None = None
    min_p: float | None = None
    min_tokens: int | None = None
    repetition_penalty: float | None = None
    regex: str | None = None
    ebnf: str | None = None
    json_schema: str | None = None
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    no_stop_trim: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    custom_params: dict[str, Any] | None = None
    rid: str | list[str] | None = None
    priority: int | None = None
    # A loaded LoRA adapter's name (a list: one per prompt of a completions batch).
    lora_path: str | list[str | None] | None = None
    # Prefill/decode disaggregation (SGLang's router adds them; entrypoints/bootstrap_fields.py).
    bootstrap_host: str | list[str] | None = None
    bootstrap_port: int | list[int] | None = None
    bootstrap_room: int | list[int] | None = None


class CompletionRequest(SamplingExtensions):
    unimplemented_fields = COMPLETION_FIELDS

    # SGLang's extras (--enable-return-routed-experts): each choice's sgl_ext.routed_experts.
    return_routed_experts: bool = False
    routed_experts_start_len: int = Field(default=0, ge=0)
    model: str | None = None
    prompt: str | list[str] | TokenIds | list[TokenIds]
    best_of: int | None = None
    echo: bool = False
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    max_tokens: int | None = 16
    n: int = Field(default=1, ge=1, le=MAX_N)
    presence_penalty: float | None = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    suffix: str | None = None
    temperature: float | None = 1.0
    top_p: float | None = 1.0
    user: str | None = None

    @field_validator("max_tokens")
    @classmethod
    def _max_tokens(cls, value: int | None) -> int | None:
        return _positive_or_none("max_tokens", value)

    @field_validator("suffix")
    @classmethod
    def _suffix(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("suffix is not supported")
        return value


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ToolCallFunction(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    arguments: str | dict[str, Any] | None = None


class MessageToolCall(BaseModel):
    """A call the assistant made, sent back in a later request's history. Typed so that a
    malformed one is a 400 naming it, not a failure while the prompt is built."""

    model_config = ConfigDict(extra="allow")
    id: str | None = None
    type: str | None = None
    function: ToolCallFunction


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    # The enum documents the roles in /openapi.json; the validator also takes other cases.
    role: str = Field(json_schema_extra={"enum": list(CHAT_ROLES)})
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    @field_validator("role")
    @classmethod
    def _role(cls, value: str) -> str:
        role = value.lower()
        if role not in CHAT_ROLES:
            raise ValueError(f"unknown role {value!r}; expected one of {', '.join(CHAT_ROLES)}")
        return role


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = False


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    model_config = ConfigDict(extra="allow")


class ChatCompletionRequest(SamplingExtensions):
    unimplemented_fields = CHAT_FIELDS

    # As CompletionRequest's (not on SamplingExtensions: /v1/responses does not take them).
    return_routed_experts: bool = False
    routed_experts_start_len: int = Field(default=0, ge=0)
    messages: list[ChatMessage] = Field(json_schema_extra={"minItems": 1})
    model: str | None = None
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    presence_penalty: float | None = 0.0
    response_format: ResponseFormat | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: str | None = None
    continue_final_message: bool = False
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("max_tokens")
    @classmethod
    def _max_tokens(cls, value: int | None) -> int | None:
        return _positive_or_none("max_tokens", value)

    @field_validator("max_completion_tokens")
    @classmethod
    def _max_completion_tokens(cls, value: int | None) -> int | None:
        return _positive_or_none("max_completion_tokens", value)

    @field_validator("messages")
    @classmethod
    def _messages(cls, value: list[ChatMessage]) -> list[ChatMessage]:
        if not value:
            raise ValueError("messages must contain at least one message")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs=true")
        return value


class EmbeddingRequest(BaseModel):
    input: str | list[str] | TokenIds | list[TokenIds]
    model: str | None = None
    encoding_format: str | None = "float"
    dimensions: int | None = None
    user: str | None = None


class TokenizeRequest(BaseModel):
    """A prompt (or prompts) to tokenize. Chat `messages` are read as a chat completion's
    (serving_tokenize.py)."""

    model: str | None = None
    prompt: str | list[str]
    add_special_tokens: bool = True


class DetokenizeRequest(BaseModel):
    model: str | None = None
    tokens: TokenIds | list[TokenIds]
    skip_special_tokens: bool = True


# -- native routes ------------------------------------------------------------------------
class GenerateReqInput(RefusesUnimplementedFields):
    """POST /generate (SGLang's GenerateReqInput, the fields this server implements)."""

    # The schema says what _one_input checks: text or input_ids, never both.
    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "oneOf": [
                {"required": ["text"], "not": {"required": ["input_ids"]}},
                {"required": ["input_ids"], "not": {"required": ["text"]}},
            ]
        },
    )
    text: str | list[str] | None = None
    input_ids: TokenIds | list[TokenIds] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    return_logprob: bool = False
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = Field(default=None, ge=0)
    # Token ids whose logprobs every output position reports (meta_info's
    # output_token_ids_logprobs); checked by the tokenizer manager, which says what is wrong.
    token_ids_logprob: Any = None
    return_text_in_logprobs: bool = False
    stream: bool = False
    rid: str | list[str] | None = None
    priority: int | None = None
    # A loaded LoRA adapter's name, or one per prompt (None: the base model).
    lora_path: str | list[str | None] | None = None
    session_params: dict[str, Any] | list[dict[str, Any]] | None = None
    custom_logit_processor: str | list[str] | None = None
    # meta_info["routed_experts"] in the final result (needs --enable-return-routed-experts),
    # from position routed_experts_start_len on.
    return_routed_experts: bool = False
    routed_experts_start_len: int = Field(default=0, ge=0)
    # A vision model's images (multimodal/request_images.py's ImageData): for one prompt an
    # image or a list; for a batch one entry per prompt. Data URL, base64 or a local path.
    image_data: str | list[str | list[str] | None] | None = None
    # Prefill/decode disaggregation (SGLang's router adds them; entrypoints/bootstrap_fields.py).
    bootstrap_host: str | list[str] | None = None
    bootstrap_port: int | list[int] | None = None
    bootstrap_room: int | list[int] | None = None
    unimplemented_fields = GENERATE_FIELDS

    @model_validator(mode="after")
    def _one_input(self) -> GenerateReqInput:
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("exactly one of text and input_ids must be given")
        return self


class EncodeReqInput(BaseModel):
    """POST /encode (SGLang's EmbeddingReqInput, the fields this server implements)."""

    text: str | list[str] | None = None
    input_ids: TokenIds | list[TokenIds] | None = None
    rid: str | list[str] | None = None


class AbortRequestInput(BaseModel):
    rid: str | None = ""
    abort_all: bool = False
