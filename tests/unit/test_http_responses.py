"""POST /v1/responses (OpenAI's Responses API) on the fake engine: shapes, streaming events,
tools, structured output, reasoning, stored responses and refusals."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from tests.unit.test_http_fakes import MODEL, REPLY, FakeEngine, make_client

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
HERMES = 'Ok <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def named_events(text: str) -> list[dict[str, Any]]:
    """Parse `event: T` / `data: {...}` pairs; each data's "type" must equal its event name."""
    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        payload = json.loads(lines["data"])
        assert payload["type"] == lines["event"]
        events.append(payload)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def _grammar_ok(engine: FakeEngine) -> FakeEngine:
    # The scripted model ignores grammars; accept every one so the request reaches it.
    engine.tokenizer_manager._grammar_backend = SimpleNamespace(compile=lambda spec: None)
    return engine


def _prompt(engine: FakeEngine, k: int = -1) -> str:
    ids = engine.calls[k]["input_ids"]
    ids = ids[0] if ids and isinstance(ids[0], list) else ids
    return engine.tokenizer.decode(ids)


def test_string_input_non_streamed() -> None:
    with make_client() as (client, engine):
        r = client.post(
            "/v1/responses",
            json={
                "model": MODEL,
                "input": "Hi",
                "instructions": "Be brief.",
                "max_output_tokens": 5,
            },
        )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "response" and body["id"].startswith("resp_")
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    (item,) = body["output"]
    assert item["type"] == "message" and item["role"] == "assistant"
    assert item["content"][0] == {
        "type": "output_text",
        "text": REPLY[:5],
        "annotations": [],
        "logprobs": [],
    }
    assert body["usage"]["output_tokens"] == 5
    assert body["usage"]["total_tokens"] == body["usage"]["input_tokens"] + 5
    assert body["instructions"] == "Be brief." and body["max_output_tokens"] == 5
    assert _prompt(engine) == "<system>Be brief.\n<user>Hi\n<assistant>"
    assert engine.calls[-1]["sampling_params"][0]["max_new_tokens"] == 5


def test_message_list_input_and_sampling_fields() -> None:
    items = [
        {"role": "developer", "content": "Rules."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Q1"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "A1"}]},
        {"role": "user", "content": "Q2"},
    ]
    body = {"input": items, "temperature": 0.5, "top_p": 0.9, "top_k": 7, "max_output_tokens": 64}
    with make_client() as (client, engine):
        r = client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "completed"
    assert r.json()["output"][0]["content"][0]["text"] == REPLY
    assert _prompt(engine) == "<developer>Rules.\n<user>Q1\n<assistant>A1\n<user>Q2\n<assistant>"
    params = engine.calls[-1]["sampling_params"][0]
    assert (params["temperature"], params["top_p"], params["top_k"]) == (0.5, 0.9, 7)


def test_streamed_events_match_non_streamed() -> None:
    body = {"input": "Hi", "max_output_tokens": 12}
    with make_client() as (client, _):
        full = client.post("/v1/responses", json=body).json()
        r = client.post("/v1/responses", json={**body, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = named_events(r.text)
    kinds = [e["type"] for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    text = full["output"][0]["content"][0]["text"]
    assert "".join(deltas) == text == REPLY[:12]
    assert events[-4]["text"] == text
    final = events[-1]["response"]
    assert final["output"][0]["content"][0]["text"] == text
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        assert final["usage"][key] == full["usage"][key]
    assert final["status"] == "incomplete"
    assert events[0]["response"]["status"] == "in_progress"


def test_function_tool_call_and_follow_up_turn() -> None:
    engine = FakeEngine(reply=HERMES)
    with make_client(engine, tool_call_parser="hermes") as (client, _):
        r = client.post("/v1/responses", json={"input": "Weather?", "tools": [WEATHER]})
        assert r.status_code == 200, r.text
        first = r.json()
        msg, call = first["output"]
        assert msg["content"][0]["text"] == "Ok"
        assert call["type"] == "function_call" and call["name"] == "get_weather"
        assert json.loads(call["arguments"]) == {"city": "Paris"}
        assert call["call_id"].startswith("call_") and call["status"] == "completed"
        assert first["tools"] == [WEATHER]
        # The standard follow-up: the call and its output appended to the input.
        follow = [
            call,
            {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"},
        ]
        engine.reply = REPLY
        r = client.post("/v1/responses", json={"input": follow, "tools": [WEATHER]})
        assert r.status_code == 200, r.text
        assert REPLY.startswith(r.json()["output"][0]["content"][0]["text"])
    prompt = _prompt(engine)
    assert prompt.endswith("<tool>sunny\n<assistant>")
    # The fake's template does not render tool_calls, so the call is written into the turn.
    assert prompt.startswith('<assistant><tool_call>\n{"name": "get_weather"')


def test_streamed_tool_call_events() -> None:
    engine = FakeEngine(reply=HERMES)
    with make_client(engine, tool_call_parser="hermes") as (client, _):
        r = client.post("/v1/responses", json={"input": "W?", "tools": [WEATHER], "stream": True})
    events = named_events(r.text)
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert len(done) == 1 and json.loads(done[0]["arguments"]) == {"city": "Paris"}
    final = events[-1]
    assert final["type"] == "response.completed"
    assert [i["type"] for i in final["response"]["output"]] == ["message", "function_call"]
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert added[1]["type"] == "function_call" and added[1]["status"] == "in_progress"


def test_named_tool_choice_is_forced_by_a_schema() -> None:
    engine = _grammar_ok(
        FakeEngine(reply='[{"name": "get_weather", "parameters": {"city": "Oslo"}}]')
    )
    body = {
        "input": "W?",
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "name": "get_weather"},
    }
    with make_client(engine) as (client, _):
        r = client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    (call,) = r.json()["output"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Oslo"}
    schema = json.loads(engine.calls[-1]["sampling_params"][0]["json_schema"])
    assert schema["type"] == "array"


def test_text_format_json_schema_maps_to_structured_output() -> None:
    engine = _grammar_ok(FakeEngine(reply='{"a": 1}'))
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}
    with make_client(engine) as (client, _):
        r = client.post("/v1/responses", json={"input": "x", "text": {"format": fmt}})
    assert r.status_code == 200, r.text
    assert json.loads(engine.calls[-1]["sampling_params"][0]["json_schema"]) == schema
    assert r.json()["text"]["format"]["name"] == "thing"


def test_reasoning_item_with_a_reasoning_parser() -> None:
    engine = FakeEngine(reply="<think>hmm</think>Answer")
    with make_client(engine, reasoning_parser="deepseek-r1") as (client, _):
        whole = client.post("/v1/responses", json={"input": "x"}).json()
        r = client.post("/v1/responses", json={"input": "x", "stream": True})
    reasoning, message = whole["output"]
    assert reasoning["type"] == "reasoning"
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "hmm"}]
    assert message["content"][0]["text"] == "Answer"
    events = named_events(r.text)
    thought = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    said = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert (thought, said) == ("hmm", "Answer")
    assert [i["type"] for i in events[-1]["response"]["output"]] == ["reasoning", "message"]


def test_gpt_oss_harmony_reasoning_and_function_call() -> None:
    # Short for the fake model's context; `<|call|>` is a stop token a real engine trims.
    reply = (
        "<|channel|>analysis<|message|>h<|end|>"
        '<|channel|>commentary to=functions.get_weather<|message|>{"city":"P"}'
    )
    engine = FakeEngine(reply=reply)
    server = {"reasoning_parser": "gpt-oss", "tool_call_parser": "gpt-oss"}
    with make_client(engine, **server) as (client, _):
        r = client.post("/v1/responses", json={"input": "x", "tools": [WEATHER]})
    assert r.status_code == 200, r.text
    assert engine.calls[-1]["sampling_params"][0]["skip_special_tokens"] is False
    reasoning, call = r.json()["output"]
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "h"}]
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "P"}


def test_store_retrieve_delete_and_previous_response_id() -> None:
    with make_client() as (client, engine):
        first = client.post("/v1/responses", json={"input": "Q1", "instructions": "Sys"}).json()
        got = client.get(f"/v1/responses/{first['id']}")
        assert got.status_code == 200 and got.json() == first
        r = client.post("/v1/responses", json={"input": "Q2", "previous_response_id": first["id"]})
        assert r.status_code == 200, r.text
        # Earlier turns are carried over; instructions apply to their own turn only.
        assert _prompt(engine) == f"<user>Q1\n<assistant>{REPLY}\n<user>Q2\n<assistant>"
        unstored = client.post("/v1/responses", json={"input": "x", "store": False}).json()
        assert client.get(f"/v1/responses/{unstored['id']}").status_code == 404
        deleted = client.delete(f"/v1/responses/{first['id']}")
        assert deleted.json() == {"id": first["id"], "object": "response", "deleted": True}
        missing = client.get(f"/v1/responses/{first['id']}")
        assert missing.status_code == 404
        assert missing.json()["error"]["type"] == "not_found_error"
        assert client.delete(f"/v1/responses/{first['id']}").status_code == 404
        r = client.post("/v1/responses", json={"input": "x", "previous_response_id": "resp_no"})
        assert r.status_code == 404 and r.json()["error"]["param"] == "previous_response_id"


def test_streamed_response_is_stored() -> None:
    with make_client() as (client, _):
        r = client.post("/v1/responses", json={"input": "x", "stream": True})
        final = named_events(r.text)[-1]["response"]
        assert client.get(f"/v1/responses/{final['id']}").json() == final


def test_store_is_bounded() -> None:
    from radixserve.entrypoints.openai.responses_store import ResponseStore, StoredResponse

    store = ResponseStore(capacity=2)
    for k in range(3):
        store.put(f"r{k}", StoredResponse({"id": f"r{k}"}, ()))
    assert len(store) == 2 and store.get("r0") is None and store.get("r2") is not None


def _error(client: Any, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post("/v1/responses", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == 400
    return err


def test_unsupported_fields_are_refused_by_name() -> None:
    cases = [
        ({"input": "x", "frobnicate": 1}, "frobnicate"),
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "truncation": "auto"}, "truncation"),
        ({"input": "x", "include": ["reasoning.encrypted_content"]}, "include"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, None),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": []}, "input"),
        ({"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}}, "text.format"),
        ({"input": "x", "tool_choice": {"type": "web_search"}}, "tool_choice"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id"),
    ]
    with make_client() as (client, _):
        for body, param in cases:
            err = _error(client, body)
            if param is not None:
                assert err["param"] == param, (body, err)
        err = _error(client, cases[5][0])
        assert err["param"] == "input[0].content[0].type" and "input_image" in err["message"]


def test_prompt_too_long_names_input() -> None:
    with make_client() as (client, _):
        err = _error(client, {"input": "x" * 500})
    assert err["param"] == "input"


def test_official_client_parses_responses_and_stream_events() -> None:
    import openai

    engine = FakeEngine(reply=HERMES)
    with make_client(engine, tool_call_parser="hermes") as (http, _):
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http)
        out = client.responses.create(model=MODEL, input="W?", tools=[WEATHER])
        call = out.output[1]
        assert call.type == "function_call" and call.name == "get_weather"
        assert out.output_text == "Ok"
        engine.reply = "Sunny."
        follow = [call, {"type": "function_call_output", "call_id": call.call_id, "output": "1"}]
        with client.responses.stream(model=MODEL, input=follow) as stream:
            deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
            final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "Sunny."
    assert final.status == "completed"
