"""Streamed Responses: the chat parser's deltas (reasoning, content, whole tool calls) as the
Responses API's typed events, each sent as `event: <type>` + `data: {json}`.

Event order for one reply (as OpenAI sends it): response.created, response.in_progress, then
per output item output_item.added, content_part.added (text and reasoning), the deltas, the
.done events, output_item.done; last response.completed (or response.incomplete). There is no
`[DONE]` line: the stream ends after the final event. A failure after the first byte is an
`error` event, then the stream ends.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse

from radixserve.entrypoints.openai.errors import ApiError, from_request_error, internal_error
from radixserve.entrypoints.openai.responses_output import (
    function_call_item,
    item_id,
    message_item,
    output_text_part,
    reasoning_item,
    reasoning_text_part,
)
from radixserve.entrypoints.sse import SSE_HEADERS
from radixserve.errors import InvalidRequestError

Event = dict[str, Any]


class _OpenPart:
    """The text item being streamed: a message (output_text) or reasoning (reasoning_text)."""

    def __init__(self, kind: str, output_index: int) -> None:
        self.kind = kind
        self.id = item_id("msg" if kind == "message" else "rs")
        self.output_index = output_index
        self.text = ""

    def item(self, status: str) -> dict[str, Any]:
        make = message_item if self.kind == "message" else reasoning_item
        return make(self.id, self.text, status)

    def part(self) -> dict[str, Any]:
        if self.kind == "message":
            return output_text_part(self.text)
        return reasoning_text_part(self.text)

    @property
    def prefix(self) -> str:
        return "response.output_text" if self.kind == "message" else "response.reasoning_text"


class ResponseEvents:
    """Turns parsed deltas into events; `output` collects the finished items."""

    def __init__(self) -> None:
        self.sequence = 0
        self.output: list[dict[str, Any]] = []
        self._open: _OpenPart | None = None

    def event(self, kind: str, **fields: Any) -> Event:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return payload

    def _where(self, part: _OpenPart) -> dict[str, Any]:
        return {"item_id": part.id, "output_index": part.output_index, "content_index": 0}

    def text(self, kind: str, delta: str) -> list[Event]:
        """A delta of `kind` ("message" or "reasoning"): opens that item when another is open."""
        if not delta:
            return []
        events: list[Event] = []
        if self._open is None or self._open.kind != kind:
            events += self.close()
            part = self._open = _OpenPart(kind, len(self.output))
            events.append(
                self.event(
                    "response.output_item.added",
                    output_index=part.output_index,
                    item=part.item("in_progress"),
                )
            )
            events.append(
                self.event("response.content_part.added", **self._where(part), part=part.part())
            )
        part = self._open
        part.text += delta
        extra = {"logprobs": []} if kind == "message" else {}
        events.append(self.event(f"{part.prefix}.delta", **self._where(part), delta=delta, **extra))
        return events

    def close(self) -> list[Event]:
        """Finishes the open text item, if any."""
        part, self._open = self._open, None
        if part is None:
            return []
        extra = {"logprobs": []} if part.kind == "message" else {}
        item = part.item("completed")
        self.output.append(item)
        return [
            self.event(f"{part.prefix}.done", **self._where(part), text=part.text, **extra),
            self.event("response.content_part.done", **self._where(part), part=part.part()),
            self.event("response.output_item.done", output_index=part.output_index, item=item),
        ]

    def tool_call(self, call: dict[str, Any]) -> list[Event]:
        """A whole parsed call (the chat parser sends each call once, complete)."""
        events = self.close()
        index = len(self.output)
        item = function_call_item(item_id("fc"), call)
        self.output.append(item)
        where = {"item_id": item["id"], "output_index": index}
        events += [
            self.event(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            ),
            self.event("response.function_call_arguments.delta", **where, delta=item["arguments"]),
            self.event(
                "response.function_call_arguments.done",
                **where,
                name=item["name"],
                arguments=item["arguments"],
            ),
            self.event("response.output_item.done", output_index=index, item=item),
        ]
        return events


def _encode(event: Event) -> bytes:
    data = json.dumps(event, ensure_ascii=False)
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


def _error_event(exc: BaseException, sequence: int) -> Event:
    if isinstance(exc, ApiError):
        err = exc
    elif isinstance(exc, InvalidRequestError):
        err = from_request_error(exc)
    else:
        err = internal_error(exc, "after a Responses stream started")
    return {
        "type": "error",
        "sequence_number": sequence,
        "code": err.err_type,
        "message": err.message,
        "param": err.param,
    }


async def _named_sse(
    events: AsyncIterator[Event], on_close: Callable[[], None] | None
) -> AsyncIterator[bytes]:
    sequence = 0
    try:
        try:
            async for event in events:
                sequence = int(event.get("sequence_number", sequence)) + 1
                yield _encode(event)
        except Exception as exc:
            yield _encode(_error_event(exc, sequence))  # logs anything not the client's fault
    finally:
        # Release first: under a cancelled task group every later await raises again.
        if on_close is not None:
            on_close()
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


def event_stream_response(
    events: AsyncIterator[Event], on_close: Callable[[], None] | None = None
) -> StreamingResponse:
    return StreamingResponse(
        _named_sse(events, on_close), media_type="text/event-stream", headers=SSE_HEADERS
    )
