"""`--tool-call-parser`: extract OpenAI tool calls from model output, whole or streamed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from radixserve.parsers.tool_calls.base import (
    ParseResult,
    StreamDelta,
    ToolCall,
    ToolCallParser,
    ToolCallStreamer,
    to_delta,
)
from radixserve.parsers.tool_calls.formats import (
    HermesParser,
    JsonArrayParser,
    Llama3Parser,
    MistralParser,
)
from radixserve.parsers.tool_calls.harmony import HarmonyToolParser
from radixserve.parsers.tool_calls.pythonic import PythonicParser

PARSERS: dict[str, type[ToolCallParser]] = {
    "hermes": HermesParser,
    "qwen": HermesParser,
    "qwen25": HermesParser,
    "llama3": Llama3Parser,
    "mistral": MistralParser,
    "pythonic": PythonicParser,
    "gpt-oss": HarmonyToolParser,
}


def make_tool_parser(name: str, tools: Sequence[Mapping[str, Any]] | None = None) -> ToolCallParser:
    """The parser named by `--tool-call-parser`; ValueError naming the option when unknown."""
    cls = PARSERS.get(name)
    if cls is None:
        raise ValueError(
            f"tool_call_parser {name!r} is not supported; expected one of {sorted(PARSERS)}"
        )
    return cls(tools)


__all__ = [
    "PARSERS",
    "HarmonyToolParser",
    "HermesParser",
    "JsonArrayParser",
    "Llama3Parser",
    "MistralParser",
    "ParseResult",
    "PythonicParser",
    "StreamDelta",
    "ToolCall",
    "ToolCallParser",
    "ToolCallStreamer",
    "make_tool_parser",
    "to_delta",
]
