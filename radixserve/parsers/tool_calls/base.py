"""Shared types of the tool-call parsers and the streaming driver they all use."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

logger = logging.getLogger(__name__)


class ToolCall(NamedTuple):
    name: str
    arguments: str  # JSON text of the arguments object


class ParseResult(NamedTuple):
    normal_text: str
    calls: list[ToolCall]


class StreamDelta(NamedTuple):
    normal_text: str
    tool_calls: list[dict[str, Any]]  # OpenAI tool-call deltas


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_names(tools: Sequence[Mapping[str, Any]] | None) -> set[str] | None:
    if not tools:
        return None
    names = set()
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            names.add(fn["name"])
    return names


def make_call(name: Any, args: Any, known: set[str] | None) -> ToolCall | None:
    """A ToolCall from decoded JSON pieces, or None (logged) when it is not a valid call."""
    if not isinstance(name, str) or not name:
        logger.warning("Dropped a tool call without a function name.")
        return None
    if known is not None and name not in known:
        # SGLang drops calls to functions the request did not offer.
        logger.warning("Model called undefined function %r; dropped.", name)
        return None
    if args is None:
        args = {}
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return ToolCall(name, args)
    return ToolCall(name, json.dumps(args, ensure_ascii=False))


def call_from_object(obj: Any, known: set[str] | None, args_keys: Iterable[str]) -> ToolCall | None:
    if not isinstance(obj, Mapping):
        return None
    args = None
    for key in args_keys:
        if key in obj:
            args = obj[key]
            break
    return make_call(obj.get("name"), args, known)


def to_delta(index: int, call: ToolCall) -> dict[str, Any]:
    return {
        "index": index,
        "id": new_call_id(),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


class ToolCallParser:
    """Base of the formats. A subclass gives `start` (where tool calls begin; the text before it
    is normal) and `parse(text, final)`; with final False, only calls already complete in `text`
    are returned, so streaming can emit each call once, whole, as soon as it is complete.
    """

    name = "base"
    start = ""

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None = None) -> None:
        self.known = tool_names(tools)

    def find_start(self, text: str, at_start: bool = True) -> int:
        """Index where tool calls begin in `text`, or -1; `at_start`: nothing came before."""
        return text.find(self.start)

    def hold_len(self, text: str) -> int:
        """How much of the tail of `text` may be the beginning of a start marker."""
        return partial_suffix(text, self.start) if self.start else 0

    def parse(self, text: str, final: bool = True) -> ParseResult:
        raise NotImplementedError

    def streamer(self) -> ToolCallStreamer:
        return ToolCallStreamer(self)


class ToolCallStreamer:
    """Streaming driver: passes normal text through until the format's start marker, then
    buffers and emits each call when complete.

    Invariant: a call is emitted exactly once, with its full arguments, at a stable index.
    """

    def __init__(self, parser: ToolCallParser) -> None:
        self.parser = parser
        self._pending = ""  # possibly the beginning of the start marker
        self._buffer = ""  # text from the start marker on
        self._in_calls = False
        self._emitted = 0
        self._seen_normal = False

    @property
    def calls_emitted(self) -> int:
        return self._emitted

    def feed(self, delta: str) -> StreamDelta:
        if not self._in_calls:
            text, self._pending = self._pending + delta, ""
            idx = self.parser.find_start(text, at_start=not self._seen_normal)
            if idx < 0:
                keep = self.parser.hold_len(text)
                if not self._seen_normal and not text.strip():
                    keep = len(text)  # only whitespace so far: a call may still open the reply
                self._pending = text[len(text) - keep :] if keep else ""
                out = text[: len(text) - keep]
                self._seen_normal = self._seen_normal or bool(out)
                return StreamDelta(out, [])
            self._in_calls = True
            normal, self._buffer = text[:idx], text[idx:]
        else:
            normal = ""
            self._buffer += delta
        result = self.parser.parse(self._buffer, final=False)
        return StreamDelta(normal, self._new_deltas(result.calls))

    def flush(self) -> StreamDelta:
        if not self._in_calls:
            text, self._pending = self._pending, ""
            return StreamDelta(text, [])
        result = self.parser.parse(self._buffer, final=True)
        return StreamDelta(result.normal_text, self._new_deltas(result.calls))

    def _new_deltas(self, calls: list[ToolCall]) -> list[dict[str, Any]]:
        fresh = calls[self._emitted :]
        deltas = [to_delta(self._emitted + k, c) for k, c in enumerate(fresh)]
        self._emitted += len(fresh)
        return deltas
