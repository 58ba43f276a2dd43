"""OpenAI-compatible routes on a fake engine: shapes, streaming, n, logprobs, echo, usage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.unit.test_http_fakes import MODEL, REPLY, make_client


def sse_events(text: str) -> list[Any]:
    events = [line[len("data: ") :] for line in text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def test_models_routes() -> None:
    with make_client() as (client, _):
        listing = client.get("/v1/models").json()
        assert listing["object"] == "list"
        assert [m["id"] for m in listing["data"]] == [MODEL]
        card = client.get(f"/v1/models/{MODEL}").json()
        assert card["id"] == MODEL and card["max_model_len"] == 128
        r = client.get("/v1/models/other-model")
        assert r.status_code == 404
        assert r.json()["error"]["type"] == "not_found_error"


def test_served_model_name_and_unknown_model(caplog: Any) -> None:
    # SGLang serves a request naming another model with the loaded one; the mismatch is
    # logged once, not per request.
    with make_client(served_model_name="alias") as (client, _):
        r = client.post("/v1/completions", json={"model": "alias", "prompt": "Hi"})
        assert r.status_code == 200 and r.json()["model"] == "alias"
        with caplog.at_level("WARNING", logger="radixserve.entrypoints.serving_context"):
            r = client.post("/v1/completions", json={"model": MODEL, "prompt": "Hi"})
            assert r.status_code == 200 and r.json()["model"] == "alias"
            r = client.post("/v1/chat/completions", json={"model": "nope", "messages": CHAT})
            assert r.status_code == 200
            assert r.json()["choices"][0]["message"]["content"]
            r = client.post("/v1/chat/completions", json={"model": "nope", "messages": CHAT})
            assert r.status_code == 200
        mismatches = [rec for rec in caplog.records if "answers every request" in rec.message]
        assert len(mismatches) == 1


def test_completion_basic_usage() -> None:
    with make_client() as (client, engine):
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 7})
    body = r.json()
    assert body["object"] == "text_completion"
    choice = body["choices"][0]
    assert choice["text"] == REPLY[:7] and choice["finish_reason"] == "length"
    assert body["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 7,
        "total_tokens": 10,
        "prompt_tokens_details": None,
    }
    assert engine.calls[0]["sampling_params"][0]["max_new_tokens"] == 7


def test_completion_stop_and_eos() -> None:
    with make_client() as (client, _):
        r = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 50, "stop": "world"})
        choice = r.json()["choices"][0]
        assert choice["text"] == "Hello "
        assert choice["finish_reason"] == "stop" and choice["matched_stop"] == "world"
        r = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 100})
        choice = r.json()["choices"][0]
        assert choice["text"] == REPLY and choice["matched_stop"] == 2


def test_completion_stream_equals_non_stream() -> None:
    body = {"prompt": "Hi", "max_tokens": 12, "temperature": 0}
    with make_client() as (client, _):
        full = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
        r = client.post("/v1/completions", json={**body, "stream": True})
    events = sse_events(r.text)
    assert "".join(e["choices"][0]["text"] for e in events) == full
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert "usage" not in events[-1] or events[-1]["usage"] is None


def test_completion_stream_include_usage() -> None:
    body = {
        "prompt": "Hi",
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with make_client() as (client, _):
        events = sse_events(client.post("/v1/completions", json=body).text)
    last = events[-1]
    assert last["choices"] == []
    assert last["usage"]["completion_tokens"] == 4 and last["usage"]["prompt_tokens"] == 3


def test_completion_n_and_batch_prompts() -> None:
    body = {"prompt": ["a", "bb"], "max_tokens": 3, "n": 2}
    with make_client() as (client, _):
        r = client.post("/v1/completions", json=body)
        body_stream = client.post("/v1/completions", json={**body, "stream": True})
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    usage = r.json()["usage"]
    # Each prompt counts once (BOS + text): 2 + 3; completions count per sample.
    assert usage["prompt_tokens"] == 5 and usage["completion_tokens"] == 12
    events = sse_events(body_stream.text)
    per_index: dict[int, str] = {}
    for e in events:
        c = e["choices"][0]
        per_index[c["index"]] = per_index.get(c["index"], "") + c["text"]
    assert per_index == {i: REPLY[:3] for i in range(4)}


def test_completion_token_id_prompts() -> None:
    with make_client() as (client, engine):
        r = client.post("/v1/completions", json={"prompt": [[40, 41], [42]], "max_tokens": 2})
    assert r.status_code == 200 and len(r.json()["choices"]) == 2
    assert engine.calls[0]["input_ids"] == [[40, 41], [42]]


def test_completion_echo_and_logprobs() -> None:
    body = {"prompt": "Hi", "max_tokens": 3, "echo": True, "logprobs": 1}
    with make_client() as (client, _):
        choice = client.post("/v1/completions", json=body).json()["choices"][0]
        streamed = sse_events(client.post("/v1/completions", json={**body, "stream": True}).text)
    assert choice["text"] == "Hi" + REPLY[:3]
    lp = choice["logprobs"]
    assert lp["tokens"][-3:] == list(REPLY[:3])
    assert lp["token_logprobs"][0] is None and lp["token_logprobs"][-1] == -0.5
    assert lp["top_logprobs"][-1] == {REPLY[2]: -0.5}
    assert lp["text_offset"][-3:] == [2, 3, 4]
    assert "".join(e["choices"][0]["text"] for e in streamed) == choice["text"]
    stream_tokens = [
        t for e in streamed for t in (e["choices"][0]["logprobs"] or {}).get("tokens", [])
    ]
    assert stream_tokens == lp["tokens"]


def test_completion_extensions_reach_sampling_params() -> None:
    body = {
        "prompt": "Hi",
        "max_tokens": 3,
        "top_k": 5,
        "min_p": 0.1,
        "repetition_penalty": 1.1,
        "min_tokens": 1,
        "ignore_eos": True,
        "skip_special_tokens": False,
        "seed": 7,
        "stop_token_ids": [299999],
        "logit_bias": {"40": 1.5},
    }
    with make_client() as (client, engine):
        r = client.post("/v1/completions", json=body)
    assert r.status_code == 200
    sp = engine.calls[0]["sampling_params"][0]
    assert sp["top_k"] == 5 and sp["min_p"] == 0.1 and sp["repetition_penalty"] == 1.1
    assert sp["min_new_tokens"] == 1 and sp["ignore_eos"] is True
    assert sp["skip_special_tokens"] is False and sp["sampling_seed"] == 7
    assert sp["stop_token_ids"] == [299999]
    assert sp["logit_bias"] == {"40": 1.5}


def test_cache_report_only_with_flag() -> None:
    body = {"prompt": "Hi", "max_tokens": 2}
    with make_client(enable_cache_report=True) as (client, _):
        client.post("/v1/completions", json=body)
        usage = client.post("/v1/completions", json=body).json()["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 2}


def test_chat_basic_and_template() -> None:
    with make_client() as (client, engine):
        r = client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": CHAT, "max_completion_tokens": 5},
        )
    body = r.json()
    assert body["object"] == "chat.completion"
    msg = body["choices"][0]["message"]
    assert msg == {
        "role": "assistant",
        "content": REPLY[:5],
        "reasoning_content": None,
        "tool_calls": None,
    }
    prompt = "<system>Be brief.\n<user>Hi\n<assistant>"
    assert engine.calls[0]["input_ids"] == [[b + 3 for b in prompt.encode()]]
    assert body["usage"]["prompt_tokens"] == len(prompt)


def test_chat_stream_equals_non_stream_and_usage() -> None:
    body = {"messages": CHAT, "max_tokens": 9, "temperature": 0}
    with make_client() as (client, _):
        full = client.post("/v1/chat/completions", json=body).json()
        r = client.post(
            "/v1/chat/completions",
            json={**body, "stream": True, "stream_options": {"include_usage": True}},
        )
    events = sse_events(r.text)
    first = {"role": "assistant", "content": "", "reasoning_content": None, "tool_calls": None}
    assert events[0]["choices"][0]["delta"] == first
    # As SGLang serializes its DeltaMessage: role, content, reasoning_content and tool_calls
    # are on every delta, null when unset (issue 31).
    for e in events:
        if e["choices"]:
            assert set(e["choices"][0]["delta"]) >= set(first)
    text = "".join(e["choices"][0]["delta"]["content"] or "" for e in events if e["choices"])
    assert text == full["choices"][0]["message"]["content"]
    assert events[-1]["usage"] == full["usage"]
    assert [e["choices"][0]["finish_reason"] for e in events[:-1]][-1] == "length"


def test_chat_n_and_logprobs() -> None:
    body = {"messages": CHAT, "max_tokens": 2, "n": 3, "logprobs": True, "top_logprobs": 2}
    with make_client() as (client, _):
        choices = client.post("/v1/chat/completions", json=body).json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    content = choices[0]["logprobs"]["content"]
    assert content[0]["token"] == "H" and content[0]["logprob"] == -0.5
    assert content[0]["bytes"] == [ord("H")]
    assert [t["token"] for t in content[0]["top_logprobs"]] == ["H", "%"]


def test_chat_continue_final_message_and_parts() -> None:
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Say "}, {"type": "text", "text": "hi"}],
        },
        {"role": "assistant", "content": "Sure:"},
    ]
    with make_client() as (client, engine):
        r = client.post(
            "/v1/chat/completions",
            json={"messages": messages, "max_tokens": 2, "continue_final_message": True},
        )
    assert r.status_code == 200
    prompt = "<user>Say hi\n<assistant>Sure:\n"
    assert engine.calls[0]["input_ids"] == [[b + 3 for b in prompt.encode()]]


def test_grammar_fields_without_a_grammar_backend_get_a_clear_400() -> None:
    # The fake engine has no grammar backend (as with --grammar-backend none).
    with make_client() as (client, _):
        r = client.post("/v1/completions", json={"prompt": "Hi", "regex": "[a-z]+"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "regex"
    assert "disabled" in r.json()["error"]["message"]


def test_chat_template_file_override(tmp_path: Path) -> None:
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}")
    with make_client(chat_template=str(template)) as (client, engine):
        client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 1})
    prompt = "[system]Be brief.[user]Hi<assistant>"
    assert engine.calls[0]["input_ids"] == [[b + 3 for b in prompt.encode()]]


def test_chat_response_format_maps_to_json_schema_and_extensions_pass() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    with make_client() as (client, engine):
        plain = client.post(
            "/v1/chat/completions",
            json={
                "messages": CHAT,
                "max_tokens": 2,
                "top_k": 3,
                "separate_reasoning": False,
                "response_format": {"type": "text"},
            },
        )
        schema_req = client.post(
            "/v1/chat/completions",
            json={
                "messages": CHAT,
                "max_tokens": 2,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": schema},
                },
            },
        )
        object_req = client.post(
            "/v1/chat/completions",
            json={"messages": CHAT, "max_tokens": 2, "response_format": {"type": "json_object"}},
        )
    assert plain.status_code == 200
    assert engine.calls[0]["sampling_params"][0]["top_k"] == 3
    # JSON response formats become json_schema constraints (refused: no grammar backend here).
    for r in (schema_req, object_req):
        assert r.status_code == 400 and r.json()["error"]["param"] == "json_schema"


def test_openai_client_compatible_shapes() -> None:
    """The official client parses our bodies into its typed objects."""
    from openai.types import Completion
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    with make_client() as (client, _):
        comp = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2}).json()
        chat = client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2})
        stream = client.post(
            "/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2, "stream": True}
        )
    assert Completion.model_validate(comp).choices[0].text == REPLY[:2]
    assert ChatCompletion.model_validate(chat.json()).choices[0].message.content == REPLY[:2]
    chunks = [ChatCompletionChunk.model_validate(e) for e in sse_events(stream.text)]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == REPLY[:2]


def test_custom_params_are_refused_not_dropped() -> None:
    """No custom logit processors are served, so custom_params would be silently ignored."""
    with make_client() as (client, _):
        for path, body in (
            ("/v1/completions", {"prompt": "Hi", "custom_params": {"k": 1}}),
            ("/v1/chat/completions", {"messages": CHAT, "custom_params": {"k": 1}}),
            ("/generate", {"text": "Hi", "sampling_params": {"custom_params": {"k": 1}}}),
        ):
            r = client.post(path, json=body)
            assert r.status_code == 400, (path, r.text)
            error = r.json()["error"]
            assert error["param"] == "custom_params" and "custom_params" in error["message"]
            assert error["type"] == "invalid_request_error"
        ok = client.post("/v1/completions", json={"prompt": "Hi", "custom_params": None})
        assert ok.status_code == 200
        ok = client.post("/v1/completions", json={"prompt": "Hi", "custom_params": {}})
        assert ok.status_code == 200


def test_openai_client_reads_delta_reasoning_content() -> None:
    # The openai client's delta objects: code written for SGLang reads these attributes
    # directly; with the fields serialized as null they are None, not missing.
    import openai

    with make_client() as (client, _):
        api = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client)
        stream = api.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=5, temperature=0, stream=True
        )
        deltas = [chunk.choices[0].delta for chunk in stream if chunk.choices]
    assert deltas and all(d.reasoning_content is None for d in deltas)  # type: ignore[attr-defined]
    assert all(d.model_extra is not None and "reasoning_content" in d.model_extra for d in deltas)
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == REPLY[:5]
