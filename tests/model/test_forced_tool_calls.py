"""Forced tool choice on the real default model: the JSON schema built for tool_choice
"required" / a named function makes every output convert into valid tool calls."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from radixserve import Engine
from radixserve.parsers.tool_calls import JsonArrayParser
from radixserve.parsers.tool_choice import forced_tool_schema


def _tool(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    params = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "parameters": params}}


CITY = {"type": "string", "maxLength": 12}
TOOL_SETS: list[tuple[list[dict[str, Any]], str]] = [
    ([_tool("get_weather", {"city": CITY}, ["city"])], "required"),
    (
        [
            _tool("add", {"a": {"type": "integer"}, "b": {"type": "integer"}}, ["a", "b"]),
            _tool("negate", {"x": {"type": "number"}}, ["x"]),
        ],
        "required",
    ),
    (
        [
            _tool("set_unit", {"unit": {"enum": ["c", "f"]}}, ["unit"]),
            _tool("get_weather", {"city": CITY}, ["city"]),
        ],
        "set_unit",
    ),
    ([_tool("flag", {"on": {"type": "boolean"}}, ["on"]), _tool("ping", {}, [])], "required"),
    (
        [_tool("tag", {"tags": {"type": "array", "items": CITY, "maxItems": 2}}, ["tags"])],
        "tag",
    ),
]


@pytest.fixture(scope="module")
def engine(default_gguf: Path) -> Iterator[Engine]:
    with Engine(
        model_path=str(default_gguf), dtype="float32", max_total_tokens=8192, runtime="thread"
    ) as eng:
        yield eng


# Slow (~30 s): forced tool calls through the HTTP layer run on fakes in
# tests/unit/test_http_chat_tools.py.
@pytest.mark.slow
def test_forced_tool_choice_outputs_always_parse(engine: Engine) -> None:
    prompts, params = [], []
    # Parallel calls are unbounded (as in SGLang), so a small model may keep adding calls until
    # max_new_tokens; half the sets use parallel_tool_calls=false (one call, must finish).
    parallel = [k % 2 == 1 for k in range(len(TOOL_SETS))]
    for (tools, choice), par in zip(TOOL_SETS, parallel, strict=True):
        names = ", ".join(t["function"]["name"] for t in tools)
        prompts.append(
            engine.tokenizer.apply_chat_template(
                [{"role": "user", "content": f"Call one of these tools: {names}."}],
                add_generation_prompt=True,
                tokenize=False,
            )
        )
        schema = forced_tool_schema(tools, choice, parallel=par)
        params.append(
            {"json_schema": json.dumps(schema), "max_new_tokens": 200, "temperature": 0.7}
        )
    results = engine.generate(prompts, params)
    for (tools, choice), par, result in zip(TOOL_SETS, parallel, results, strict=True):
        finish = result["meta_info"]["finish_reason"]["type"]
        if not par or finish == "stop":
            assert finish == "stop", result
            assert isinstance(json.loads(result["text"]), list)
        # A truncated parallel reply still yields its complete calls.
        calls = JsonArrayParser(tools).parse(result["text"]).calls
        assert calls, result["text"]
        if not par:
            assert len(calls) == 1
        by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
        for call in calls:
            if choice != "required":
                assert call.name == choice
            jsonschema.validate(json.loads(call.arguments), by_name[call.name])
