"""A Responses request -> the chat completion request that serves it.

The Responses API is chat completions with another shape: `instructions` is a system message,
`input` items are messages, earlier `function_call`s and their `function_call_output`s, tools
are flat (`{"type": "function", "name", ...}` instead of `{"function": {...}}`) and `text.format`
is chat's `response_format`. Mapping onto ChatCompletionRequest lets the chat machinery (chat
template, sampling, tool-call parsing, grammar-forced tool choice, reasoning parsers) serve it
unchanged. Every refusal is an ApiError naming the field in the Responses body's terms.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from radixserve.entrypoints.openai.errors import ApiError, validation_error_to_api
from radixserve.entrypoints.openai.protocol import ChatCompletionRequest, SamplingExtensions
from radixserve.entrypoints.openai.responses_protocol import ResponsesRequest

_MESSAGE_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, param=param)


def _text_of(content: Any, where: str) -> str:
    """A message's content (a string or a list of text parts) as one string."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where} must be a string or a list of content parts.", where)
    return "".join(_part_text(part, f"{where}[{j}]") for j, part in enumerate(content))


def _part_text(part: Any, where: str) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind not in _TEXT_PARTS:
        raise _bad(
            f"Content parts of type {kind!r} are not supported by this model (it reads text only).",
            f"{where}.type",
        )
    text = part.get("text", part.get("refusal"))
    if not isinstance(text, str):
        raise _bad("A text content part needs a string 'text'.", f"{where}.text")
    return text


def _image_part(part: dict[str, Any], where: str) -> dict[str, Any]:
    """An `input_image` part as the chat machinery takes it: chat_images.py reads `image_url`
    given as a string (a data URL, an http(s) URL, a path) and fetches and checks it later, with
    the same rules as chat's image_url parts. `detail` has no effect: LLaVA-1.5 sees one crop."""
    url = part.get("image_url")
    if part.get("file_id") is not None and url is None:
        raise _bad(
            "input_image parts with a file_id are not supported (this server has no Files "
            "API); give image_url (a data URL or an http(s) URL).",
            f"{where}.file_id",
        )
    if not isinstance(url, str) or not url:
        raise _bad("An input_image part needs image_url (a string).", f"{where}.image_url")
    return {"type": "input_image", "image_url": url}


def _content_of(content: Any, where: str, takes_images: bool) -> str | list[dict[str, Any]]:
    """A message's content for the chat request: one string when it is all text (or the model
    reads text only, which refuses an image part by its type), else a list of text and image
    parts, in order (the chat template writes each image's placeholder where its part sits)."""
    if (
        not takes_images
        or not isinstance(content, list)
        or not any(isinstance(p, dict) and p.get("type") == "input_image" for p in content)
    ):
        return _text_of(content, where)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") == "input_image":
            parts.append(_image_part(part, f"{where}[{j}]"))
        else:
            parts.append({"type": "text", "text": _part_text(part, f"{where}[{j}]")})
    return parts


def _required_str(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise _bad(f"{where}.{key} is required and must be a string.", f"{where}.{key}")
    return value


class _Conversation:
    """Builds chat messages from input items; consecutive function calls (and a reasoning
    item before them) join one assistant message, as the model produced them together."""

    def __init__(self, takes_images: bool = False) -> None:
        self.takes_images = takes_images
        self.messages: list[dict[str, Any]] = []
        # The item each message came from (its `where`), so that an error about a message
        # names the client's item, not its position in the chat request.
        self.origins: list[str] = []
        self._reasoning: str | None = None

    def append(self, msg: dict[str, Any], where: str) -> None:
        self.messages.append(msg)
        self.origins.append(where)

    def _open_assistant(self, where: str) -> dict[str, Any]:
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
            return last
        msg: dict[str, Any] = {"role": "assistant", "content": None}
        self._attach_reasoning(msg)
        self.append(msg, where)
        return msg

    def _attach_reasoning(self, msg: dict[str, Any]) -> None:
        if self._reasoning is not None:
            msg["reasoning_content"] = self._reasoning
            self._reasoning = None

    def add(self, item: Any, where: str) -> None:
        if not isinstance(item, dict):
            raise _bad(f"{where} must be an object.", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _MESSAGE_ROLES:
                raise _bad(
                    f"{where}.role must be one of {', '.join(_MESSAGE_ROLES)}, got {role!r}.",
                    f"{where}.role",
                )
            content = item.get("content")
            where_content = f"{where}.content"
            msg = {
                "role": role,
                # Images only in a user's message; other roles' content stays text.
                "content": _content_of(content, where_content, self.takes_images)
                if role == "user"
                else _text_of(content, where_content),
            }
            if role == "assistant":
                self._attach_reasoning(msg)
            self.append(msg, where)
        elif kind == "function_call":
            call = {
                "id": _required_str(item, "call_id", where),
                "type": "function",
                "function": {
                    "name": _required_str(item, "name", where),
                    "arguments": _required_str(item, "arguments", where),
                },
            }
            self._open_assistant(where).setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text_of(output, f"{where}.output")
            call_id = _required_str(item, "call_id", where)
            self.append({"role": "tool", "tool_call_id": call_id, "content": text}, where)
        elif kind == "reasoning":
            self._reasoning = _reasoning_text(item)
        else:
            raise _bad(
                f"Input items of type {kind!r} are not supported by this server (message, "
                "function_call, function_call_output and reasoning are).",
                f"{where}.type",
            )


def _reasoning_text(item: dict[str, Any]) -> str:
    parts = item.get("content") or item.get("summary") or []
    return "".join(p.get("text", "") for p in parts if isinstance(p, dict))


def _input_conversation(req: ResponsesRequest, takes_images: bool = False) -> _Conversation:
    conv = _Conversation(takes_images)
    if isinstance(req.input, str):
        conv.append({"role": "user", "content": req.input}, "input")
        return conv
    for i, item in enumerate(req.input):
        conv.add(item, f"input[{i}]")
    return conv


def input_messages(req: ResponsesRequest, takes_images: bool = False) -> list[dict[str, Any]]:
    """This turn's input as chat messages (without instructions or earlier turns);
    `takes_images`: a vision model, whose user messages keep their input_image parts."""
    return _input_conversation(req, takes_images).messages


def message_origins(
    req: ResponsesRequest, history_len: int, takes_images: bool = False
) -> list[str]:
    """For each message of `to_chat_request(req, history)`, the Responses field it came from:
    `instructions`, `previous_response_id` (an earlier turn) or the input item."""
    origins = ["instructions"] if req.instructions else []
    origins += ["previous_response_id"] * history_len
    return origins + _input_conversation(req, takes_images).origins


def output_messages(output: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A stored response's output items as chat messages, for `previous_response_id`."""
    conv = _Conversation()
    for i, item in enumerate(output):
        conv.add(item, f"output[{i}]")
    return conv.messages


def chat_tools(tools: Sequence[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Flat Responses function tools -> chat's nested form; hosted tools are refused."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise _bad(
                f"Tools of type {tool.get('type')!r} are not supported by this server; only "
                "function tools are.",
                f"tools[{i}].type",
            )
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise _bad("A function tool needs a 'name'.", f"tools[{i}].name")
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if choice is None or isinstance(choice, str):
        return choice  # "none" | "auto" | "required", checked by the chat machinery
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _bad(
        "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...}.",
        "tool_choice",
    )


def _response_format(req: ResponsesRequest) -> dict[str, Any] | None:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.schema_ is None:
        raise _bad("text.format.schema is required when type is 'json_schema'.", "text.format")
    schema = {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict}
    return {"type": "json_schema", "json_schema": schema}


# SGLang's sampling extensions pass through unchanged (top_k, min_p, regex, rid, ...).
_EXTENSIONS = tuple(SamplingExtensions.model_fields)


def to_chat_request(
    req: ResponsesRequest, history: Sequence[dict[str, Any]] = (), takes_images: bool = False
) -> ChatCompletionRequest:
    """The chat request for `req`; `history` is the earlier turns (previous_response_id);
    `takes_images`: a vision model (input_image parts become the chat's image parts)."""
    messages: list[dict[str, Any]] = []
    if req.instructions:
        # As in OpenAI's API, instructions apply to this turn only: they are not carried over.
        messages.append({"role": "system", "content": req.instructions})
    messages += list(history)
    messages += input_messages(req, takes_images)
    body: dict[str, Any] = {
        name: getattr(req, name) for name in _EXTENSIONS if name in req.model_fields_set
    }
    body.update(
        messages=messages,
        model=req.model,
        max_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        seed=req.seed,
        tools=chat_tools(req.tools),
        tool_choice=chat_tool_choice(req.tool_choice),
        parallel_tool_calls=req.parallel_tool_calls,
        response_format=_response_format(req),
        stream=req.stream,
        user=req.user,
    )
    if req.reasoning is not None and req.reasoning.effort is not None:
        body["chat_template_kwargs"] = {"reasoning_effort": req.reasoning.effort}
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        err = validation_error_to_api(exc)
        # Positions in `messages` do not match the client's `input`; say "input" instead.
        param = err.param or ""
        if param.startswith("messages"):
            raise _bad(err.message.replace(param, "input"), "input") from exc
        raise err from exc
