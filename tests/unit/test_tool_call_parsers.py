from __future__ import annotations

import json
import random
from typing import Any

import pytest

from radixserve.parsers.tool_calls import (
    JsonArrayParser,
    ToolCall,
    ToolCallParser,
    make_tool_parser,
)

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}},
]
W = ToolCall("get_weather", json.dumps({"city": "Paris", "unit": "c"}))
A = ToolCall("add", json.dumps({"a": 1, "b": [2, 3]}))

CASES: list[tuple[str, str, str, list[ToolCall]]] = [
    (
        "hermes",
        'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}'
        '\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": [2, 3]}}\n'
        "</tool_call>",
        "Sure.",
        [W, A],
    ),
    ("qwen25", "no calls <here>", "no calls <here>", []),
    (
        "qwen",
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": [2, 3]}}</tool_call>',
        "",
        [A],
    ),
    (
        "llama3",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}; '
        '{"name": "add", "parameters": {"a": 1, "b": [2, 3]}}',
        "",
        [W, A],
    ),
    ("llama3", '{"name": "add", "parameters": {"a": 1, "b": [2, 3]}}', "", [A]),
    ("llama3", "The set {1, 2} is small.", "The set {1, 2} is small.", []),
    (
        "mistral",
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}, '
        '{"name": "add", "arguments": {"a": 1, "b": [2, 3]}}]',
        "",
        [W, A],
    ),
    ("mistral", '[TOOL_CALLS]add[ARGS]{"a": 1, "b": [2, 3]}', "", [A]),
    (
        "pythonic",
        'Calling. [get_weather(city="Paris", unit="c"), add(a=1, b=[2, 3])]',
        "Calling.",
        [W, A],
    ),
    ("pythonic", "A list [1, 2] is fine.", "A list [1, 2] is fine.", []),
]


def _stream(parser: ToolCallParser, text: str, seed: int) -> tuple[str, list[dict[str, Any]]]:
    rng = random.Random(seed)
    streamer = parser.streamer()
    normal, deltas, pos = "", [], 0
    while pos < len(text):
        step = rng.randint(1, 7)
        out = streamer.feed(text[pos : pos + step])
        normal, pos = normal + out.normal_text, pos + step
        deltas.extend(out.tool_calls)
    out = streamer.flush()
    return normal + out.normal_text, deltas + out.tool_calls


@pytest.mark.parametrize(("name", "text", "normal", "calls"), CASES)
def test_parse_complete_text(name: str, text: str, normal: str, calls: list[ToolCall]) -> None:
    result = make_tool_parser(name, TOOLS).parse(text)
    assert result.calls == calls
    assert result.normal_text.strip() == normal


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("name", "text", "normal", "calls"), CASES)
def test_streamed_in_random_chunks(
    name: str, text: str, normal: str, calls: list[ToolCall], seed: int
) -> None:
    got_normal, deltas = _stream(make_tool_parser(name, TOOLS), text, seed)
    assert got_normal.strip() == normal
    assert [d["index"] for d in deltas] == list(range(len(calls)))
    assert all(d["type"] == "function" and d["id"].startswith("call_") for d in deltas)
    got = [ToolCall(d["function"]["name"], d["function"]["arguments"]) for d in deltas]
    assert got == calls


def test_each_call_is_emitted_as_soon_as_it_closes() -> None:
    streamer = make_tool_parser("hermes", TOOLS).streamer()
    first = streamer.feed('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
    assert [d["function"]["name"] for d in first.tool_calls] == ["add"]
    assert streamer.feed("<tool_call>{").tool_calls == []


def test_calls_to_undefined_functions_are_dropped() -> None:
    text = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    assert make_tool_parser("hermes", TOOLS).parse(text).calls == []


def test_json_array_parser_reads_forced_output() -> None:
    text = '[{"name": "add", "parameters": {"a": 1, "b": [2, 3]}}]'
    assert JsonArrayParser(TOOLS).parse(text).calls == [A]


def test_unknown_parser_names_the_option() -> None:
    with pytest.raises(ValueError, match="tool_call_parser"):
        make_tool_parser("nope")
