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
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS:
            raise _bad(
                f"Content parts of type {kind!r} are not supported by this model (it reads "
                "text only).",
                f"{where}[{j}].type",
            )
        text = part.get("text", part.get("refusal"))
        if not isinstance(text, str):
            raise _bad("A text content part needs a string 'text'.", f"{where}[{j}].text")
        texts.append(text)
    return "".join(texts)


def _required_str(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise _bad(f"{where}.{key} is required and must be a string.", f"{where}.{key}")
    return value


class _Conversation:
    """Builds chat messages from input items; consecutive function calls (and a reasoning
    item before them) join one assistant message, as the model produced them together."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._reasoning: str | None = None

    def _open_assistant(self) -> dict[str, Any]:
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
            return last
        msg: dict[str, Any] = {"role": "assistant", "content": None}
        self._attach_reasoning(msg)
        self.messages.append(msg)
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
            msg = {"role": role, "content": _text_of(item.get("content"), f"{where}.content")}
            if role == "assistant":
                self._attach_reasoning(msg)
            self.messages.append(msg)
        elif kind == "function_call":
            call = {
                "id": _required_str(item, "call_id", where),
                "type": "function",
                "function": {
                    "name": _required_str(item, "name", where),
                    "arguments": _required_str(item, "arguments", where),
                },
            }
            self._open_assistant().setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text_of(output, f"{where}.output")
            call_id = _required_str(item, "call_id", where)
            self.messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
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


def input_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """This turn's input as chat messages (without instructions or earlier turns)."""
    if isinstance(req.input, str):
        return [{"role": "user", "content": req.input}]
    conv = _Conversation()
    for i, item in enumerate(req.input):
        conv.add(item, f"input[{i}]")
    return conv.messages


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
    req: ResponsesRequest, history: Sequence[dict[str, Any]] = ()
) -> ChatCompletionRequest:
    """The chat request for `req`; `history` is the earlier turns (previous_response_id)."""
    messages: list[dict[str, Any]] = []
    if req.instructions:
        # As in OpenAI's API, instructions apply to this turn only: they are not carried over.
        messages.append({"role": "system", "content": req.instructions})
    messages += list(history)
    messages += input_messages(req)
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
