"""Native routes on a fake engine: /generate in all its shapes, info, admin and utility routes."""

from __future__ import annotations

import json
from typing import Any

from tests.unit.test_http_fakes import CONTEXT, MODEL, REPLY, VOCAB, FakeEngine, make_client


def sse_events(text: str) -> list[Any]:
    events = [line[len("data: ") :] for line in text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


GREEDY = {"max_new_tokens": 5, "temperature": 0}


def test_generate_text_single() -> None:
    with make_client() as (client, _):
        r = client.post("/generate", json={"text": "Hi", "sampling_params": GREEDY})
    assert r.status_code == 200
    body = r.json()
    assert body["text"] == REPLY[:5]
    assert len(body["output_ids"]) == 5
    meta = body["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "matched": None}
    assert meta["prompt_tokens"] == 3 and meta["completion_tokens"] == 5
    assert meta["weight_version"] == "default"


def test_generate_input_ids_and_rid() -> None:
    with make_client() as (client, engine):
        r = client.post(
            "/generate", json={"input_ids": [5, 6, 7], "sampling_params": GREEDY, "rid": "my-rid"}
        )
    assert r.status_code == 200
    assert r.json()["meta_info"]["id"] == "my-rid"
    assert engine.calls[0]["input_ids"] == [[5, 6, 7]]


def test_generate_batch_and_n() -> None:
    body = {"text": ["a", "b"], "sampling_params": {**GREEDY, "n": 2}}
    with make_client() as (client, _):
        r = client.post("/generate", json=body)
    assert r.status_code == 200
    results = r.json()
    assert isinstance(results, list) and len(results) == 4
    assert all(res["text"] == REPLY[:5] for res in results)


def test_generate_stream_is_cumulative_and_ends_with_done() -> None:
    body = {"text": "Hi", "sampling_params": GREEDY, "stream": True}
    with make_client() as (client, _):
        r = client.post("/generate", json=body)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    texts = [e["text"] for e in events]
    assert texts[-1] == REPLY[:5]
    assert all(texts[-1].startswith(t) for t in texts)  # cumulative, like SGLang
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert "index" not in events[0]


def test_generate_stream_incremental_option() -> None:
    body = {"text": "Hi", "sampling_params": GREEDY, "stream": True}
    with make_client(incremental_streaming_output=True) as (client, _):
        r = client.post("/generate", json=body)
    events = sse_events(r.text)
    assert "".join(e["text"] for e in events) == REPLY[:5]
    assert max(len(e["text"]) for e in events) < 5


def test_generate_batch_stream_has_indices() -> None:
    body = {"text": ["a", "bb"], "sampling_params": GREEDY, "stream": True}
    with make_client() as (client, _):
        r = client.post("/generate", json=body)
    events = sse_events(r.text)
    finals = {e["index"]: e["text"] for e in events if e["meta_info"]["finish_reason"]}
    assert finals == {0: REPLY[:5], 1: REPLY[:5]}


def test_generate_logprobs_with_text() -> None:
    body = {
        "text": "Hi",
        "sampling_params": GREEDY,
        "return_logprob": True,
        "top_logprobs_num": 2,
        "return_text_in_logprobs": True,
    }
    with make_client() as (client, _):
        meta = client.post("/generate", json=body).json()["meta_info"]
    entries = meta["output_token_logprobs"]
    assert len(entries) == 5
    assert entries[0] == [-0.5, ord("H") + 3, "H"]
    assert meta["output_top_logprobs"][0][0][2] == "H"


def test_health_and_info_routes() -> None:
    with make_client() as (client, _):
        assert client.get("/health").status_code == 200
        assert client.get("/health_generate").status_code == 200
        for path in ("/get_model_info", "/model_info"):
            info = client.get(path).json()
            assert info["model_path"] == MODEL
            assert info["is_generation"] is True
            assert info["architectures"] == ["FakeForCausalLM"]
        for path in ("/get_server_info", "/server_info"):
            info = client.get(path).json()
            assert info["served_model_name"] == MODEL
            assert info["max_total_num_tokens"] == 1000
            assert info["internal_states"][0]["num_running_reqs"] == 0
            assert "version" in info
        assert client.get("/version").json()["version"]


def test_server_info_is_plain_json_with_every_option_at_the_top() -> None:
    """Issue 31: `other` (the options without a typed field) was one stringified
    ReadOnlyMapping; each of them is a top-level key with its JSON value, as SGLang lists them."""
    from radixserve.entrypoints.native_api import _args_dict
    from radixserve.server_args import ServerArgs

    args = ServerArgs(device="cpu", api_key="sekrit")
    info = json.loads(json.dumps(_args_dict(args)))  # plain JSON types only
    assert "other" not in info
    assert info["tokenizer_worker_num"] == args.other["tokenizer_worker_num"]
    assert set(args.other) <= set(info)
    assert info["api_key"] == "<redacted>"
    assert not any(isinstance(v, str) and "Mapping(" in v for v in info.values())


def test_server_info_redacts_keys() -> None:
    with make_client(api_key="sekrit-key") as (client, _):
        r = client.get("/get_server_info", headers={"Authorization": "Bearer sekrit-key"})
    assert r.status_code == 200
    assert "sekrit-key" not in r.text
    assert r.json()["api_key"] == "<redacted>"


def test_flush_cache() -> None:
    with make_client() as (client, engine):
        client.post("/generate", json={"text": "Hi", "sampling_params": GREEDY})
        assert engine.seen_prompts
        r = client.post("/flush_cache")
        assert r.status_code == 200 and "Cache flushed" in r.text
        assert not engine.seen_prompts
        engine.active["busy"] = 3
        r = client.post("/flush_cache")
        assert r.status_code == 400
        assert r.json()["error"]["type"] == "invalid_request_error"


def test_abort_request_routes() -> None:
    with make_client() as (client, engine):
        assert client.post("/abort_request", json={"rid": "abc"}).status_code == 200
        assert "abc" in engine.abort_flags
        engine.active["x"] = 1
        assert client.post("/abort_request", json={"abort_all": True}).status_code == 200
        assert "x" in engine.abort_flags
        r = client.post("/abort_request", json={})
        assert r.status_code == 400 and r.json()["error"]["param"] == "rid"


def test_tokenize_and_detokenize() -> None:
    with make_client() as (client, _):
        for path in ("/tokenize", "/v1/tokenize"):
            r = client.post(path, json={"prompt": "ab"})
            assert r.json() == {"tokens": [1, 100, 101], "count": 3, "max_model_len": CONTEXT}
        r = client.post("/v1/tokenize", json={"prompt": ["a", "bc"], "add_special_tokens": False})
        assert r.json()["count"] == [1, 2]
        for path in ("/detokenize", "/v1/detokenize"):
            assert client.post(path, json={"tokens": [100, 101]}).json() == {"text": "ab"}
        r = client.post("/detokenize", json={"tokens": [[100], [101]]})
        assert r.json() == {"text": ["a", "b"]}
        r = client.post("/detokenize", json={"tokens": [VOCAB + 5]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"


def test_tokenize_chat_messages_applies_the_chat_template() -> None:
    # SGLang tokenizes chat `messages` through the chat template: the ids a chat completion
    # with the same messages would run.
    chat = [{"role": "user", "content": "Hi"}]
    with make_client() as (client, engine):
        r = client.post("/v1/tokenize", json={"messages": chat})
        assert r.status_code == 200, r.text
        body = r.json()
        client.post("/v1/chat/completions", json={"messages": chat, "max_tokens": 1})
        assert [body["tokens"]] == engine.calls[-1]["input_ids"]
        assert body["count"] == len(body["tokens"]) and body["max_model_len"] == CONTEXT
        bare = client.post("/tokenize", json={"messages": chat, "add_generation_prompt": False})
        assert bare.status_code == 200
        assert bare.json()["count"] < body["count"]  # no "<assistant>" generation prompt
        both = client.post("/v1/tokenize", json={"messages": chat, "prompt": "Hi"})
        assert both.status_code == 400 and both.json()["error"]["param"] == "messages"
        empty = client.post("/v1/tokenize", json={"messages": []})
        assert empty.status_code == 400 and set(empty.json()["error"]) == {
            "message",
            "type",
            "param",
            "code",
        }


def test_encode_and_embeddings_refused_without_embedding_model() -> None:
    with make_client() as (client, _):
        r = client.post("/encode", json={"text": "hi"})
        assert r.status_code == 400
        assert "does not serve an embedding model" in r.json()["error"]["message"]
        r = client.post("/v1/embeddings", json={"input": "hi", "model": MODEL})
        assert r.status_code == 400
        assert "does not serve an embedding model" in r.json()["error"]["message"]
    with make_client(is_embedding=True) as (client, _):
        r = client.post("/v1/embeddings", json={"input": "hi"})
        assert r.status_code == 400 and "not supported" in r.json()["error"]["message"]


def test_metrics_only_with_flag() -> None:
    with make_client() as (client, _):
        assert client.get("/metrics").status_code == 404
    with make_client(enable_metrics=True) as (client, _):
        client.post("/generate", json={"text": "Hi", "sampling_params": GREEDY})
        client.post("/generate", json={"text": "Hi", "sampling_params": GREEDY, "stream": True})
        text = client.get("/metrics").text
    assert f'sglang:prompt_tokens_total{{model_name="{MODEL}"}} 6.0' in text
    assert f'sglang:generation_tokens_total{{model_name="{MODEL}"}} 10.0' in text
    assert f'sglang:time_to_first_token_seconds_count{{model_name="{MODEL}"}} 1.0' in text
    assert f'sglang:inter_token_latency_seconds_count{{model_name="{MODEL}"}} 4.0' in text
    assert f'sglang:e2e_request_latency_seconds_count{{model_name="{MODEL}"}} 2.0' in text
    assert f'sglang:num_running_reqs{{model_name="{MODEL}"}} 0.0' in text
    assert f'sglang:max_total_num_tokens{{model_name="{MODEL}"}} 1000.0' in text
    # The second identical prompt hit the (fake) cache: 2 of 6 prompt tokens.
    assert f'sglang:cache_hit_rate{{model_name="{MODEL}"}} 0.333' in text


def test_generate_ignores_unknown_fields() -> None:
    engine = FakeEngine()
    with make_client(engine) as (client, _):
        r = client.post("/generate", json={"text": "Hi", "sampling_params": GREEDY, "foo": 1})
    assert r.status_code == 200
