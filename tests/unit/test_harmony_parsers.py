"""gpt-oss's harmony output: `--reasoning-parser gpt-oss` and `--tool-call-parser gpt-oss`,
whole and streamed (every split of the text into two deltas, and one character at a time)."""

from __future__ import annotations

import json

import pytest

from radixserve.parsers.chat_output import ChoiceStream, OutputPlan, parse_choice
from radixserve.parsers.harmony_reasoning import HarmonyReasoningParser
from radixserve.parsers.reasoning_parsers import make_reasoning_parser
from radixserve.parsers.tool_calls import HarmonyToolParser, ToolCall, make_tool_parser

TOOLS = (
    {"type": "function", "function": {"name": "get_weather"}},
    {"type": "function", "function": {"name": "add"}},
)
ANALYSIS = "<|channel|>analysis<|message|>"
NEXT = "<|end|><|start|>assistant"
FINAL = "<|channel|>final<|message|>"
PREAMBLE = "<|channel|>commentary<|message|>"
WEATHER = (
    '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "SF"}'
)
ADD = '<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 1, "b": 2}'
W = ToolCall("get_weather", json.dumps({"city": "SF"}))
A = ToolCall("add", json.dumps({"a": 1, "b": 2}))

# (model output, reasoning, content) for the reasoning parser alone.
REASONING_CASES = [
    (f"{ANALYSIS}Just thinking.", "Just thinking.", ""),
    (f"{ANALYSIS}2+2 is 4.{NEXT}{FINAL}It is 4.<|return|>", "2+2 is 4.", "It is 4."),
    (f"{ANALYSIS}2+2 is 4.{NEXT}{FINAL}It is 4.", "2+2 is 4.", "It is 4."),  # stop trimmed
    (f"{FINAL}Direct answer.", "", "Direct answer."),
    ("Plain text <b>with</b> no markers.", "", "Plain text <b>with</b> no markers."),
    (f"{ANALYSIS}a{NEXT}{PREAMBLE}Checking.{NEXT}{FINAL}Done.", "a", "Checking.Done."),
    # A model that forgets <|end|>: the next header still ends the analysis.
    (f"{ANALYSIS}think<|start|>assistant{FINAL}answer", "think", "answer"),
    # gpt-oss-20b's stray `<|channel|>commentary to=assistant` before the real channel.
    (
        f"<|channel|>commentary to=assistant{ANALYSIS}r{NEXT}<|channel|>commentary{FINAL}c",
        "r",
        "c",
    ),
    # The recipient in the role part right after the prompt's `<|start|>assistant`.
    (
        ' to=functions.add<|channel|>commentary json<|message|>{"a": 1}',
        "",
        '<|channel|>commentary to=functions.add<|message|>{"a": 1}',
    ),
    # Cut off inside a header: the header carries no text.
    (f"{ANALYSIS}think{NEXT}<|channel|>fin", "think", ""),
]


def _splits(text: str) -> list[list[str]]:
    return [[text[:k], text[k:]] for k in range(len(text) + 1)] + [list(text)]


def _stream_reasoning(text: str, chunks: list[str], stream_reasoning: bool) -> tuple[str, str]:
    parser = HarmonyReasoningParser(stream_reasoning)
    parts = [parser.feed(c) for c in chunks] + [parser.flush()]
    return "".join(p.reasoning for p in parts), "".join(p.content for p in parts)


@pytest.mark.parametrize(("text", "reasoning", "content"), REASONING_CASES)
def test_reasoning_whole(text: str, reasoning: str, content: str) -> None:
    assert tuple(HarmonyReasoningParser().parse(text)) == (reasoning, content)


@pytest.mark.parametrize(("text", "reasoning", "content"), REASONING_CASES)
@pytest.mark.parametrize("stream_reasoning", [True, False])
def test_reasoning_streamed_at_every_split(
    text: str, reasoning: str, content: str, stream_reasoning: bool
) -> None:
    for chunks in _splits(text):
        assert _stream_reasoning(text, chunks, stream_reasoning) == (reasoning, content), chunks


def test_markers_never_leak_into_streamed_deltas() -> None:
    text = f"{ANALYSIS}why{NEXT}{FINAL}ok<|return|>"
    parser = HarmonyReasoningParser()
    for ch in text:
        part = parser.feed(ch)
        assert "<|" not in part.reasoning + part.content and "|>" not in part.content


def test_stream_reasoning_false_sends_reasoning_when_the_analysis_ends() -> None:
    parser = HarmonyReasoningParser(stream_reasoning=False)
    assert parser.feed(f"{ANALYSIS}step one, ").reasoning == ""
    assert parser.feed("step two").reasoning == ""
    assert tuple(parser.feed(f"{NEXT}{FINAL}Hi")) == ("step one, step two", "Hi")


def test_tool_message_passes_through_to_the_content_normalized() -> None:
    # Recipient in the role part, as the harmony spec also allows.
    text = f'{ANALYSIS}t{NEXT} to=functions.add<|channel|>commentary json<|message|>{{"a": 1}}'
    out = HarmonyReasoningParser().parse(text)
    assert out == ("t", '<|channel|>commentary to=functions.add<|message|>{"a": 1}')


def test_factory_names_gpt_oss_and_refuses_unknown() -> None:
    assert isinstance(make_reasoning_parser("gpt-oss"), HarmonyReasoningParser)
    with pytest.raises(ValueError, match="reasoning_parser 'nope'"):
        make_reasoning_parser("nope")


# (model output after the reasoning split or raw, normal text, calls) for the tool parser.
TOOL_CASES = [
    (f"{WEATHER}<|call|>", "", [W]),
    (WEATHER, "", [W]),  # <|call|> is a stop token, usually trimmed
    (f"Let me check.{WEATHER}<|call|>", "Let me check.", [W]),
    (f"{WEATHER}<|call|>{ADD}<|call|>", "", [W, A]),
    (f"Both:{WEATHER}<|call|>{ADD}", "Both:", [W, A]),
    (
        '<|start|>assistant to=functions.add<|channel|>commentary json<|message|>{"a": 1, "b": 2}',
        "",
        [A],
    ),
    ("No tools needed.", "No tools needed.", []),
    (' to=functions.add<|channel|>commentary json<|message|>{"a": 1, "b": 2}', "", [A]),
    # A tool call in the analysis channel still counts (llama.cpp accepts it too).
    ('<|channel|>analysis to=functions.add<|message|>{"a": 1, "b": 2}<|call|>', "", [A]),
    (
        "x<|channel|>commentary to=assistant<|message|>y",
        "x<|channel|>commentary to=assistant<|message|>y",
        [],
    ),
    (f"{FINAL}plain final", f"{FINAL}plain final", []),
    # Cut off mid-arguments: no call, the text is kept.
    (
        '<|channel|>commentary to=functions.add<|message|>{"a": 1',
        '<|channel|>commentary to=functions.add<|message|>{"a": 1',
        [],
    ),
    # Cut off inside the header: kept as text.
    ("Hi<|channel|>commentary to=functions.ad", "Hi<|channel|>commentary to=functions.ad", []),
    # A function the request did not offer is dropped (SGLang's rule).
    ("<|channel|>commentary to=functions.rm<|message|>{}<|call|>", "", []),
]


def _stream_tools(chunks: list[str]) -> tuple[str, list[ToolCall]]:
    streamer = HarmonyToolParser(TOOLS).streamer()
    parts = [streamer.feed(c) for c in chunks] + [streamer.flush()]
    deltas = [d for p in parts for d in p.tool_calls]
    assert [d["index"] for d in deltas] == list(range(len(deltas)))
    calls = [ToolCall(d["function"]["name"], d["function"]["arguments"]) for d in deltas]
    return "".join(p.normal_text for p in parts), calls


@pytest.mark.parametrize(("text", "normal", "calls"), TOOL_CASES)
def test_tool_calls_whole(text: str, normal: str, calls: list[ToolCall]) -> None:
    result = make_tool_parser("gpt-oss", TOOLS).parse(text, final=True)
    assert (result.normal_text, result.calls) == (normal, calls)


@pytest.mark.parametrize(("text", "normal", "calls"), TOOL_CASES)
def test_tool_calls_streamed_at_every_split(text: str, normal: str, calls: list[ToolCall]) -> None:
    for chunks in _splits(text):
        got_normal, got_calls = _stream_tools(chunks)
        assert got_calls == calls, chunks
        assert got_normal.strip() == normal.strip(), chunks


def test_a_terminated_call_streams_before_the_reply_ends() -> None:
    streamer = HarmonyToolParser(TOOLS).streamer()
    assert streamer.feed("Sure. ").normal_text == "Sure. "
    out = streamer.feed(f"{WEATHER}<|call|>")
    assert [d["function"]["name"] for d in out.tool_calls] == ["get_weather"]


def test_invalid_json_arguments_of_a_terminated_call_are_kept_raw() -> None:
    text = "<|channel|>commentary to=functions.add<|message|>{a: 1}<|call|>"
    assert HarmonyToolParser(TOOLS).parse(text).calls == [ToolCall("add", "{a: 1}")]


PLAN = OutputPlan(reasoning_parser="gpt-oss", tool_parser="gpt-oss", tool_mode="parse", tools=TOOLS)
CHAT_CASES = [
    (
        f"{ANALYSIS}need data{NEXT}{PREAMBLE}Checking.{NEXT}{WEATHER}<|call|>",
        "need data",
        "Checking.",
        [W],
    ),
    (f"{ANALYSIS}two{NEXT}{WEATHER}<|call|>{ADD}", "two", None, [W, A]),
    (f"{ANALYSIS}easy{NEXT}{FINAL}It is 4.", "easy", "It is 4.", []),
]


@pytest.mark.parametrize(("text", "reasoning", "content", "calls"), CHAT_CASES)
def test_chat_output_reasoning_then_tools(
    text: str, reasoning: str, content: str | None, calls: list[ToolCall]
) -> None:
    out = parse_choice(PLAN, text)
    got = [ToolCall(c["function"]["name"], c["function"]["arguments"]) for c in out.tool_calls]
    assert (out.reasoning, out.content, got) == (reasoning, content, calls)
    for chunks in _splits(text):
        stream = ChoiceStream(PLAN)
        parts = [stream.feed(c) for c in chunks] + [stream.feed("", final=True)]
        deltas = [d for p in parts for d in p.tool_calls]
        assert "".join(p.reasoning for p in parts) == reasoning, chunks
        assert "".join(p.content for p in parts).strip() == (content or ""), chunks
        assert [d["function"]["name"] for d in deltas] == [c.name for c in calls], chunks


def test_plan_asks_for_special_tokens_only_with_a_harmony_parser() -> None:
    assert PLAN.needs_special_tokens
    assert OutputPlan(reasoning_parser="gpt-oss").needs_special_tokens
    assert OutputPlan(tool_parser="gpt-oss", tool_mode="parse").needs_special_tokens
    assert not OutputPlan(tool_parser="gpt-oss", tool_mode="off").needs_special_tokens
    assert not OutputPlan(reasoning_parser="qwen3", tool_parser="hermes").needs_special_tokens
