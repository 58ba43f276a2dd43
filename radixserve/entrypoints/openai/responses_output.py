"""Output items, usage and the response object of the Responses API, built from what the chat
machinery parsed (content, reasoning, tool calls) and the engine's MetaInfo."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from radixserve.entrypoints.openai.responses_protocol import ResponsesRequest
from radixserve.managers.outputs import MetaInfo


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def new_response_id() -> str:
    return item_id("resp")


def message_item(item_id_: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [] if status == "in_progress" else [output_text_part(text)]
    return {
        "type": "message",
        "id": item_id_,
        "status": status,
        "role": "assistant",
        "content": content,
    }


def output_text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_item(item_id_: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [] if status == "in_progress" else [reasoning_text_part(text)]
    return {
        "type": "reasoning",
        "id": item_id_,
        "summary": [],
        "content": content,
        "status": status,
    }


def reasoning_text_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def function_call_item(
    item_id_: str, call: Mapping[str, Any], status: str = "completed"
) -> dict[str, Any]:
    """A function_call item from a chat tool call ({"id", "function": {"name", "arguments"}})."""
    function = call.get("function") or {}
    return {
        "type": "function_call",
        "id": item_id_,
        "call_id": call.get("id") or item_id("call"),
        "name": function.get("name", ""),
        "arguments": "" if status == "in_progress" else function.get("arguments", ""),
        "status": status,
    }


def output_items(
    content: str | None, reasoning: str | None, tool_calls: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """A whole reply's items in the order the model wrote them: reasoning, text, calls."""
    items = []
    if reasoning:
        items.append(reasoning_item(item_id("rs"), reasoning))
    if content:
        items.append(message_item(item_id("msg"), content))
    items += [function_call_item(item_id("fc"), call) for call in tool_calls]
    return items


def usage_of(meta: MetaInfo | None, reasoning_tokens: int = 0) -> dict[str, Any]:
    """The usage block; all zeros without a meta info (a stream that sent nothing)."""
    prompt = meta.prompt_tokens if meta is not None else 0
    completion = meta.completion_tokens if meta is not None else 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": meta.cached_tokens if meta is not None else 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": prompt + completion,
    }


def status_of(finish_reason: str | None) -> tuple[str, dict[str, Any] | None]:
    """(status, incomplete_details) from the chat finish reason."""
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish_reason == "abort":
        return "cancelled", None
    if finish_reason is None:
        return "in_progress", None
    return "completed", None


def response_object(
    req: ResponsesRequest,
    response_id: str,
    model: str,
    *,
    created_at: int | None = None,
    status: str = "in_progress",
    output: list[dict[str, Any]] | None = None,
    incomplete_details: dict[str, Any] | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The response body; request settings are echoed as OpenAI's API echoes them."""
    text = req.text.model_dump(by_alias=True, exclude_none=True) if req.text else {}
    text.setdefault("format", {"type": "text"})
    reasoning = req.reasoning.model_dump() if req.reasoning else {"effort": None, "summary": None}
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at if created_at is not None else int(time.time()),
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": incomplete_details,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {},
        "model": model,
        "output": output or [],
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": reasoning,
        "store": req.store,
        "temperature": req.temperature,
        "text": text,
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "tools": req.tools or [],
        "top_p": req.top_p,
        "truncation": "disabled",
        "usage": usage,
        "user": req.user,
    }
