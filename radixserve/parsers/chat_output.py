"""Turns one chat choice's generated text into OpenAI's message / delta fields: reasoning
(`--reasoning-parser`), tool calls (`--tool-call-parser`, or the forced-choice JSON array) and
content. Used by the chat completions handler, whole and streamed."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from radixserve.parsers.reasoning_parsers import AnyReasoningParser, make_reasoning_parser
from radixserve.parsers.tool_calls import (
    JsonArrayParser,
    ToolCallParser,
    ToolCallStreamer,
    make_tool_parser,
)
from radixserve.parsers.tool_choice import resolve_tool_choice

logger = logging.getLogger(__name__)

# Parsers whose markers are special tokens: the chat path decodes with skip_special_tokens off.
SPECIAL_TOKEN_PARSERS = frozenset({"gpt-oss"})


@dataclass(frozen=True)
class OutputPlan:
    """What to extract from a request's outputs. `tool_mode`: "off", "parse" (auto with a
    configured parser) or "forced" (required / named: the grammar-made JSON array)."""

    reasoning_parser: str | None = None
    stream_reasoning: bool = True
    tool_parser: str | None = None
    tool_mode: str = "off"
    tools: tuple[Any, ...] = field(default_factory=tuple)

    def make_tool_parser(self) -> ToolCallParser | None:
        if self.tool_mode == "forced":
            return JsonArrayParser(self.tools)
        if self.tool_mode == "parse" and self.tool_parser is not None:
            return make_tool_parser(self.tool_parser, self.tools)
        return None

    def make_reasoning_parser(self) -> AnyReasoningParser | None:
        return make_reasoning_parser(self.reasoning_parser, self.stream_reasoning)

    @property
    def needs_special_tokens(self) -> bool:
        """True when a parser in use reads special tokens (harmony's markers are special
        tokens of gpt-oss's tokenizer), so the text must be detokenized with them."""
        tools_on = self.tool_mode == "parse" and self.tool_parser is not None
        return self.reasoning_parser in SPECIAL_TOKEN_PARSERS or (
            tools_on and self.tool_parser in SPECIAL_TOKEN_PARSERS
        )


def plan_output(server_args: Any, req: Any) -> OutputPlan:
    """The plan for a ChatCompletionRequest under the server's parser options."""
    reasoning = getattr(server_args, "reasoning_parser", None)
    tool_parser = getattr(server_args, "tool_call_parser", None)
    choice = resolve_tool_choice(req.tool_choice, req.tools)
    if choice == "none":
        mode = "off"
    elif choice == "auto":
        mode = "parse" if tool_parser else "off"
    else:
        mode = "forced"
    return OutputPlan(
        reasoning_parser=reasoning if req.separate_reasoning else None,
        stream_reasoning=req.stream_reasoning,
        tool_parser=tool_parser,
        tool_mode=mode,
        tools=tuple(req.tools or ()),
    )


class ChoiceOutput(NamedTuple):
    content: str | None
    reasoning: str | None
    tool_calls: list[dict[str, Any]]


def _plain_calls(deltas: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in d.items() if k != "index"} for d in deltas]


def parse_choice(plan: OutputPlan, text: str) -> ChoiceOutput:
    """A whole reply -> message fields (content None when only tool calls were made)."""
    reasoning = None
    rparser = plan.make_reasoning_parser()
    if rparser is not None:
        split = rparser.parse(text)
        reasoning, text = split.reasoning or None, split.content
    tparser = plan.make_tool_parser()
    if tparser is None:
        return ChoiceOutput(text, reasoning, [])
    streamer = ToolCallStreamer(tparser)
    first, last = streamer.feed(text), streamer.flush()
    calls = _plain_calls(first.tool_calls + last.tool_calls)
    if not calls:
        return ChoiceOutput(text, reasoning, [])
    normal = (first.normal_text + last.normal_text).strip()
    return ChoiceOutput(normal or None, reasoning, calls)


class ChoiceStream:
    """One streamed choice: text deltas in, (content, reasoning, tool-call deltas) out.

    Invariant: reasoning is split off first, and only the content part reaches the tool parser.
    """

    def __init__(self, plan: OutputPlan) -> None:
        self._reasoning = plan.make_reasoning_parser()
        parser = plan.make_tool_parser()
        self._tools = ToolCallStreamer(parser) if parser is not None else None

    @property
    def made_tool_calls(self) -> bool:
        return self._tools is not None and self._tools.calls_emitted > 0

    def feed(self, delta: str, final: bool = False) -> ChoiceOutput:
        reasoning, content = "", delta
        if self._reasoning is not None:
            part = self._reasoning.feed(delta)
            reasoning, content = part.reasoning, part.content
            if final:
                tail = self._reasoning.flush()
                reasoning, content = reasoning + tail.reasoning, content + tail.content
        if self._tools is None:
            return ChoiceOutput(content, reasoning, [])
        out = self._tools.feed(content)
        normal, calls = out.normal_text, list(out.tool_calls)
        if final:
            tail_calls = self._tools.flush()
            normal, calls = normal + tail_calls.normal_text, calls + tail_calls.tool_calls
        return ChoiceOutput(normal, reasoning, calls)
