"""Chat completions with tools and reasoning on the fake engine (scripted model replies)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from tests.unit.test_http_fakes import FakeEngine, make_client
from tests.unit.test_http_openai import sse_events

CHAT = [{"role": "user", "content": "hi"}]
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    },
}
TOOLS = [ADD, {"type": "function", "function": {"name": "now"}}]
HERMES = 'Ok <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'


def _post(
    reply: str, body: dict[str, Any], grammar: bool = False, **server: Any
) -> tuple[Any, FakeEngine]:
    engine = FakeEngine(reply=reply)
    if grammar:
        # The scripted model ignores grammars; accept every one so the request reaches it.
        engine.tokenizer_manager._grammar_backend = SimpleNamespace(compile=lambda spec: None)
    with make_client(engine, **server) as (client, _):
        r = client.post("/v1/chat/completions", json={"messages": CHAT, **body})
    return r, engine


def _schema(engine: FakeEngine) -> dict[str, Any]:
    params = engine.calls[-1]["sampling_params"]
    params = params[0] if isinstance(params, list) else params
    return json.loads(params["json_schema"])


def _stream(
    reply: str, body: dict[str, Any], grammar: bool = False, **server: Any
) -> list[dict[str, Any]]:
    r, _ = _post(reply, {**body, "stream": True}, grammar, **server)
    assert r.status_code == 200, r.text
    return [e["choices"][0] for e in sse_events(r.text) if e["choices"]]


def test_auto_tool_choice_parses_calls() -> None:
    r, _ = _post(HERMES, {"tools": TOOLS}, tool_call_parser="hermes")
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Ok"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "add", "arguments": json.dumps({"a": 1})}


def test_tool_choice_none_or_no_parser_keeps_plain_content() -> None:
    for body, server in (
        ({"tools": TOOLS, "tool_choice": "none"}, {"tool_call_parser": "hermes"}),
        ({"tools": TOOLS}, {}),
    ):
        choice = _post(HERMES, body, **server)[0].json()["choices"][0]
        assert choice["message"]["content"] == HERMES
        assert choice["message"]["tool_calls"] is None
        assert choice["finish_reason"] == "stop"


def test_streamed_tool_call_deltas() -> None:
    choices = _stream(HERMES, {"tools": TOOLS}, tool_call_parser="qwen")
    content = "".join(c["delta"].get("content") or "" for c in choices)
    calls = [t for c in choices for t in c["delta"].get("tool_calls") or []]
    assert content.strip() == "Ok"
    assert [(t["index"], t["function"]["name"]) for t in calls] == [(0, "add")]
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 1}
    assert choices[-1]["finish_reason"] == "tool_calls"


def test_required_tool_choice_is_forced_by_a_json_schema() -> None:
    reply = '[{"name": "add", "parameters": {"a": 2}}, {"name": "now", "parameters": {}}]'
    r, engine = _post(reply, {"tools": TOOLS, "tool_choice": "required"}, grammar=True)
    schema = _schema(engine)
    assert schema["type"] == "array" and schema["minItems"] == 1
    names = [item["properties"]["name"]["enum"] for item in schema["items"]["anyOf"]]
    assert names == [["add"], ["now"]]
    calls = r.json()["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["add", "now"]
    assert r.json()["choices"][0]["finish_reason"] == "tool_calls"


def test_named_tool_choice_allows_one_call_of_that_function() -> None:
    choice = {"type": "function", "function": {"name": "add"}}
    reply = '[{"name": "add", "parameters": {"a": 3}}]'
    choices = _stream(reply, {"tools": TOOLS, "tool_choice": choice}, grammar=True)
    _, engine = _post(reply, {"tools": TOOLS, "tool_choice": choice}, grammar=True)
    schema = _schema(engine)
    assert schema["maxItems"] == 1
    assert schema["items"]["properties"]["name"]["enum"] == ["add"]
    calls = [t for c in choices for t in c["delta"].get("tool_calls") or []]
    assert [json.loads(t["function"]["arguments"]) for t in calls] == [{"a": 3}]


def test_bad_tool_choice_is_a_400_naming_the_field() -> None:
    for body, param in (
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"function": {"name": "x"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tools"),
        ({"tools": [{"type": "function"}]}, "tools"),
    ):
        r, _ = _post("x", body)
        assert r.status_code == 400, body
        assert r.json()["error"]["param"] == param


def test_reasoning_is_separated_whole_and_streamed() -> None:
    reply = "<think>2+2</think>\n\nIt is 4."
    r, _ = _post(reply, {}, reasoning_parser="deepseek-r1")
    message = r.json()["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("2+2", "It is 4.")
    choices = _stream(reply, {}, reasoning_parser="qwen3")
    reasoning = "".join(c["delta"].get("reasoning_content") or "" for c in choices)
    content = "".join(c["delta"].get("content") or "" for c in choices)
    assert (reasoning, content) == ("2+2", "It is 4.")


def test_separate_reasoning_false_keeps_everything_in_content() -> None:
    reply = "<think>2+2</think>It is 4."
    r, _ = _post(reply, {"separate_reasoning": False}, reasoning_parser="deepseek-r1")
    message = r.json()["choices"][0]["message"]
    assert message["content"] == reply and message["reasoning_content"] is None


def test_reasoning_then_tool_call() -> None:
    reply = '<think>use add</think><tool_call>{"name": "add", "arguments": {}}</tool_call>'
    r, _ = _post(reply, {"tools": TOOLS}, reasoning_parser="qwen3", tool_call_parser="hermes")
    message = r.json()["choices"][0]["message"]
    assert message["reasoning_content"] == "use add"
    assert message["content"] is None
    assert message["tool_calls"][0]["function"]["name"] == "add"


# Shaped like SmolLM2's template (shorter, for the fake model's 128-token context): it
# concatenates message['content'] and knows nothing of tool_calls.
CONCAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] + ':' + message['content'] + '\\n' }}"
    "{% endfor %}"
)


def test_two_round_tool_conversation_as_the_openai_client_sends_it() -> None:
    """Round 1 returns a call; round 2 sends it back as an assistant message with content
    null plus tool_calls, then the tool's result. Both rounds answer 200 (streamed and not),
    and the prompt of round 2 shows the model its own call and the result."""
    first, _ = _post(HERMES, {"tools": TOOLS}, tool_call_parser="hermes")
    assert first.status_code == 200, first.text
    message = first.json()["choices"][0]["message"]
    (call,) = message["tool_calls"]
    follow_up = [
        *CHAT,
        {"role": "assistant", "content": None, "tool_calls": message["tool_calls"]},
        {"role": "tool", "tool_call_id": call["id"], "content": "3"},
    ]
    for stream in (False, True):
        engine = FakeEngine(reply="The sum is 3.")
        overrides = {"tool_call_parser": "hermes", "chat_template": CONCAT_TEMPLATE}
        with make_client(engine, **overrides) as (client, _):
            r = client.post(
                "/v1/chat/completions",
                json={"messages": follow_up, "tools": TOOLS, "stream": stream},
            )
        assert r.status_code == 200, r.text
        ids = engine.calls[-1]["input_ids"]
        prompt = engine.tokenizer.decode(ids[0] if isinstance(ids[0], list) else ids)
        assert '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>' in prompt
        assert "\ntool:3\n" in prompt
        if stream:
            text = "".join(
                e["choices"][0]["delta"].get("content") or ""
                for e in sse_events(r.text)
                if e["choices"]
            )
        else:
            text = r.json()["choices"][0]["message"]["content"]
        assert text == "The sum is 3."


def test_templates_that_render_tool_calls_get_them_unchanged() -> None:
    from radixserve.entrypoints.openai.chat_template import to_template_messages
    from radixserve.entrypoints.openai.protocol import ChatMessage

    calls = [{"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}}]
    msg = ChatMessage(role="assistant", content=None, tool_calls=calls)
    (item,) = to_template_messages([msg], "{{ m.tool_calls }}")
    assert item == {"role": "assistant", "content": "", "tool_calls": calls}


# Short for the fake model's 128-token context: no `<|start|>assistant` between the messages
# and no `<|call|>` (a stop token, trimmed by a real engine).
HARMONY = (
    "<|channel|>analysis<|message|>use add<|end|>"
    '<|channel|>commentary to=functions.add<|message|>{"a": 1}'
)


def test_gpt_oss_harmony_reasoning_and_tool_call_whole_and_streamed() -> None:
    server = {"reasoning_parser": "gpt-oss", "tool_call_parser": "gpt-oss"}
    r, engine = _post(HARMONY, {"tools": TOOLS}, **server)
    params = engine.calls[-1]["sampling_params"]
    params = params[0] if isinstance(params, list) else params
    # Harmony's markers are special tokens: the parsers need them decoded.
    assert params["skip_special_tokens"] is False
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert (message["reasoning_content"], message["content"]) == ("use add", None)
    assert message["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 1}'}
    choices = _stream(HARMONY, {"tools": TOOLS}, **server)
    reasoning = "".join(c["delta"].get("reasoning_content") or "" for c in choices)
    calls = [t for c in choices for t in c["delta"].get("tool_calls") or []]
    assert reasoning == "use add"
    assert [t["function"]["name"] for t in calls] == ["add"]
    assert choices[-1]["finish_reason"] == "tool_calls"


def test_gpt_oss_harmony_final_answer_and_default_special_tokens_elsewhere() -> None:
    reply = "<|channel|>analysis<|message|>2+2<|end|><|start|>assistant<|channel|>final<|message|>4"
    r, _ = _post(reply, {}, reasoning_parser="gpt-oss")
    message = r.json()["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("2+2", "4")
    _, engine = _post("plain", {}, reasoning_parser="qwen3")
    params = engine.calls[-1]["sampling_params"]
    params = params[0] if isinstance(params, list) else params
    assert params["skip_special_tokens"] is True
