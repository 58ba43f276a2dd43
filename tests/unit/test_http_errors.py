"""Bad input on every generating route: a 4xx with OpenAI's error body naming the field, never a
500, traceback or host path, and the next normal request still works."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.unit.test_http_fakes import MODEL, FakeEngine, make_client

CHAT = [{"role": "user", "content": "Hi"}]
GOOD = ("/v1/completions", {"prompt": "Hi", "max_tokens": 2})


def assert_error(r: Any, status: int, param: str | None = "unset") -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status and err["message"]
    if param != "unset":
        assert err["param"] == param, err
    assert "Traceback" not in r.text and "/work/" not in r.text
    return err


def assert_still_serving(client: TestClient) -> None:
    r = client.post(GOOD[0], json=GOOD[1])
    assert r.status_code == 200 and r.json()["choices"][0]["text"]


@pytest.fixture(scope="module")
def client() -> Any:
    with make_client() as (client, _):
        yield client


COMPLETION_CASES = [
    ({"max_tokens": 2}, "prompt"),  # missing prompt
    ({"prompt": "Hi", "max_tokens": "abc"}, "max_tokens"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": "x" * 200}, "prompt"),  # longer than the 128-token context
    ({"prompt": "Hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "Hi", "max_tokens": -3}, "max_tokens"),
    ({"prompt": "Hi", "max_tokens": 10**9}, "max_tokens"),
    ({"prompt": "Hi", "temperature": -1}, "temperature"),
    ({"prompt": "Hi", "temperature": "hot"}, "temperature"),
    ({"prompt": "Hi", "top_p": 0}, "top_p"),
    ({"prompt": "Hi", "top_p": 1.5}, "top_p"),
    ({"prompt": "Hi", "top_k": 0}, "top_k"),
    ({"prompt": "Hi", "min_p": 2}, "min_p"),
    ({"prompt": "Hi", "frequency_penalty": 3}, "frequency_penalty"),
    ({"prompt": "Hi", "presence_penalty": -3}, "presence_penalty"),
    ({"prompt": "Hi", "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": "Hi", "n": 0}, "n"),
    ({"prompt": "Hi", "n": 100000}, "n"),
    ({"prompt": "Hi", "stop": ["s"] * 300}, "stop"),
    ({"prompt": "Hi", "stop": [""]}, "stop"),
    ({"prompt": [[5, 99999]]}, "prompt"),  # token id outside the vocabulary
    ({"prompt": [[5, -1]]}, "prompt"),
    ({"prompt": "Hi", "logit_bias": {"99999": 1.0}}, "logit_bias"),
    ({"prompt": "Hi", "logit_bias": {"abc": 1.0}}, "logit_bias"),
    ({"prompt": "Hi", "logprobs": 50}, "logprobs"),
    ({"prompt": "Hi", "min_tokens": 5, "max_tokens": 2}, "min_tokens"),
    ({"prompt": "Hi", "regex": "a", "json_schema": "{}"}, "regex"),
    ({"prompt": "Hi", "suffix": "tail"}, "suffix"),
    (
        {"prompt": "Hi", "stream_options": {"include_usage": "maybe"}},
        "stream_options.include_usage",
    ),
]


@pytest.mark.parametrize(("body", "param"), COMPLETION_CASES)
@pytest.mark.parametrize("stream", [False, True])
def test_completion_bad_input(client: TestClient, body: dict, param: str, stream: bool) -> None:
    r = client.post("/v1/completions", json={**body, "stream": stream})
    assert_error(r, 400, param)
    assert_still_serving(client)


def _calls(*calls: Any) -> dict[str, Any]:
    """A history whose assistant turn carries `calls` as its tool_calls."""
    return {"messages": [*CHAT, {"role": "assistant", "content": None, "tool_calls": list(calls)}]}


CHAT_CASES = [
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x" * 200}]}, "messages"),
    ({"messages": CHAT, "max_completion_tokens": 10**9}, "max_completion_tokens"),
    ({"messages": CHAT, "max_tokens": 0}, "max_tokens"),
    ({"messages": CHAT, "top_logprobs": 3}, "top_logprobs"),
    ({"messages": CHAT, "logprobs": True, "top_logprobs": 30}, "top_logprobs"),
    ({"messages": CHAT, "n": 0}, "n"),
    ({"messages": CHAT, "temperature": 3.5e38, "top_p": -1}, "top_p"),
    ({"messages": CHAT, "continue_final_message": True}, "continue_final_message"),
    ({"messages": CHAT, "response_format": {"type": "xml"}}, "response_format.type"),
    ({"messages": CHAT, "response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "messages[0].content[0].type",
    ),
    # A malformed earlier tool call in the history was a 500 while the prompt was built.
    (_calls({"function": 5}), "messages[1].tool_calls[0].function"),
    (_calls({}), "messages[1].tool_calls[0].function"),
    (_calls({"function": {"arguments": "{}"}}), "messages[1].tool_calls[0].function.name"),
    (_calls("call"), "messages[1].tool_calls[0]"),
]


@pytest.mark.parametrize(("body", "param"), CHAT_CASES)
def test_chat_bad_input(client: TestClient, body: dict, param: str) -> None:
    assert_error(client.post("/v1/chat/completions", json=body), 400, param)
    assert_error(client.post("/v1/chat/completions", json={**body, "stream": True}), 400, param)
    assert_still_serving(client)


GENERATE_CASES = [
    ({}, None),
    ({"text": "Hi", "input_ids": [5]}, None),
    ({"text": 5}, "text"),
    ({"input_ids": [5, 99999]}, "input_ids"),
    ({"input_ids": [5, True]}, "input_ids"),
    ({"input_ids": []}, "input_ids"),
    ({"text": "Hi", "sampling_params": {"bogus": 1}}, "bogus"),
    ({"text": "Hi", "sampling_params": {"temperature": -2}}, "temperature"),
    ({"text": "Hi", "sampling_params": {"n": 0}}, "sampling_params.n"),
    ({"text": ["a", "b"], "rid": ["x", "x"]}, "rid"),
    ({"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params"),
    # A text-only model: image_data is refused, by name.
    ({"text": "Hi", "image_data": "abc"}, "image_data"),
    ({"text": "Hi", "routed_dp_rank": 0}, None),
    ({"text": "Hi", "return_hidden_states": True}, None),
]


@pytest.mark.parametrize(("body", "param"), GENERATE_CASES)
def test_generate_bad_input(client: TestClient, body: dict, param: str | None) -> None:
    assert_error(client.post("/generate", json=body), 400, param)
    assert_error(client.post("/generate", json={**body, "stream": True}), 400, param)
    assert_still_serving(client)


UNIMPLEMENTED = [
    ("/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2}}, "return_hidden_states"),
    ("/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2}}, "routed_dp_rank"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2}, "routed_dp_rank"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2}, "session_params"),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2}, "return_hidden_states"),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2}, "input_ids"),
]


@pytest.mark.parametrize(("path", "body", "field"), UNIMPLEMENTED)
def test_unimplemented_sglang_fields_are_refused_not_ignored(
    client: TestClient, path: str, body: dict, field: str
) -> None:
    """SGLang's fields that would change the request are refused by name when set; sent back
    at their defaults (null, false, empty) they are accepted, and unknown fields are ignored."""
    value = [5] if field in ("input_ids",) else {"id": "s"} if field == "session_params" else 1
    err = assert_error(client.post(path, json={**body, field: value}), 400)
    assert field in err["message"]
    for default in (None, False, []):
        r = client.post(path, json={**body, field: default, "some_other_client_field": 1})
        assert r.status_code == 200, r.text
    assert_still_serving(client)


RAW_CASES = [
    (b"{not json", "application/json", 400),
    (b'{"prompt": "Hi", "max_tokens": NaN}', "application/json", 400),
    (b'{"prompt": "\xff\xfe"}', "application/json", 400),  # invalid UTF-8
    (b'{"prompt": "\\ud800"}', "application/json", 400),  # lone surrogate escape
    (b"[1, 2]", "application/json", 400),
    (b"", "application/json", 400),
    (b'{"prompt": "Hi"}', "text/plain", 415),
    (b"prompt=Hi", "application/x-www-form-urlencoded", 415),
]


@pytest.mark.parametrize(("raw", "ctype", "status"), RAW_CASES)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/generate"])
def test_raw_body_errors(
    client: TestClient, path: str, raw: bytes, ctype: str, status: int
) -> None:
    r = client.post(path, content=raw, headers={"Content-Type": ctype})
    assert_error(r, status)
    assert_still_serving(client)


def test_overflowing_number_is_refused(client: TestClient) -> None:
    raw = b'{"messages": [{"role": "user", "content": "Hi"}], "temperature": 1e999}'
    r = client.post(
        "/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"}
    )
    assert_error(r, 400, "temperature")


def test_json_without_content_type_is_accepted(client: TestClient) -> None:
    r = client.post("/v1/completions", content=json.dumps(GOOD[1]).encode())
    assert r.status_code == 200


def test_stop_token_ids_outside_vocab_are_accepted(client: TestClient) -> None:
    r = client.post(
        "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "stop_token_ids": [10**7]}
    )
    assert r.status_code == 200


def test_unknown_route_and_method(client: TestClient) -> None:
    assert_error(client.get("/no/such/route"), 404)
    assert_error(client.get("/v1/completions"), 405)


def test_oversized_body_gets_413(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXSERVE_MAX_REQUEST_BODY_BYTES", "1000")
    with make_client() as (client, _):
        r = client.post("/v1/completions", json={"prompt": "x" * 2000})
        assert_error(r, 413)

        def chunks() -> Any:  # no Content-Length: the limit applies while reading
            for _ in range(10):
                yield b" " * 200

        r = client.post(
            "/v1/completions", content=chunks(), headers={"Content-Type": "application/json"}
        )
        assert_error(r, 413)
        assert_still_serving(client)


def test_error_after_stream_started_is_an_sse_event() -> None:
    with make_client(FakeEngine(fail_after=2)) as (client, _):
        r = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 6, "stream": True})
        assert r.status_code == 200
        lines = [ln for ln in r.text.split("\n") if ln.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        err = json.loads(lines[-2][len("data: ") :])["error"]
        assert err["code"] == 500 and err["type"] == "internal_server_error"
        assert "/secret" not in r.text
        assert json.loads(lines[0][len("data: ") :])["choices"][0]["text"] == "H"


def test_engine_failure_non_stream_is_a_clean_500() -> None:
    with make_client(FakeEngine(fail_after=1)) as (client, _):
        r = client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 4})
        err = assert_error(r, 500)
        assert err["message"].startswith("Internal server error (request id err-")
        assert "/secret" not in r.text


@pytest.mark.parametrize("path", ["/v1/completions", "/generate"])
def test_a_value_error_inside_the_engine_is_a_logged_500_not_a_400(
    path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Only InvalidRequestError (radixserve.errors) is the client's fault; a bare ValueError is
    a bug: a 500 whose request id finds the logged traceback, and no host path in the body."""
    body: dict[str, Any] = {"prompt": "Hi", "max_tokens": 4}
    if path == "/generate":
        body = {"text": "Hi", "sampling_params": {"max_new_tokens": 4}}
    with make_client(FakeEngine(fail_after=1, fail_exc=ValueError)) as (client, _):
        with caplog.at_level(logging.ERROR, logger="radixserve"):
            r = client.post(path, json=body)
        err = assert_error(r, 500)
        assert err["type"] == "internal_server_error" and err["param"] is None
        error_id = r.headers["X-Request-Id"]
        assert error_id in err["message"] and "/secret" not in r.text
        assert "Traceback" not in r.text
        logged = [rec for rec in caplog.records if error_id in rec.getMessage()]
        assert logged and logged[0].exc_info is not None
        assert "/secret/host/path" in str(logged[0].exc_info[1])


def test_a_value_error_mid_stream_is_a_logged_500_event(caplog: pytest.LogCaptureFixture) -> None:
    engine = FakeEngine(fail_after=2, fail_exc=ValueError)
    with make_client(engine) as (client, _), caplog.at_level(logging.ERROR, logger="radixserve"):
        r = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 6, "stream": True})
    lines = [ln for ln in r.text.split("\n") if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    err = json.loads(lines[-2][len("data: ") :])["error"]
    assert err["code"] == 500 and "request id err-" in err["message"]
    error_id = err["message"].split("request id ")[1].rstrip(").")
    assert any(error_id in rec.getMessage() for rec in caplog.records)
    assert "/secret" not in r.text


def test_client_errors_share_one_base_class() -> None:
    from radixserve.errors import InvalidRequestError
    from radixserve.managers.request_router import RequestRouter
    from radixserve.managers.tokenizer_manager import RequestError
    from radixserve.parsers.tool_choice import ToolChoiceError
    from radixserve.sampling.constrained import GrammarError
    from radixserve.sampling.sampling_params import SamplingParamsError

    for cls in (RequestError, SamplingParamsError, GrammarError, ToolChoiceError):
        assert issubclass(cls, InvalidRequestError)
    router = RequestRouter()
    router.register("a", lambda out: None)
    with pytest.raises(InvalidRequestError) as info:
        router.register("a", lambda out: None)
    assert info.value.param == "rid"


def test_abort_with_error_status_becomes_that_status(client: TestClient) -> None:
    engine = FakeEngine()
    original = engine._finish

    def finish(msg: Any, *args: Any) -> Any:
        from radixserve.messages import FinishReason

        return FinishReason("abort", message="The request queue is full.", status_code=503)

    engine._finish = finish  # type: ignore[method-assign]
    with make_client(engine) as (c, _):
        err = assert_error(c.post("/v1/completions", json=GOOD[1]), 503)
        assert err["message"] == "The request queue is full."
        r = c.post("/v1/completions", json={**GOOD[1], "stream": True})
        assert '"code": 503' in r.text and r.text.rstrip().endswith("data: [DONE]")
    engine._finish = original  # type: ignore[method-assign]


def test_unknown_model_is_served_by_the_loaded_model(client: TestClient) -> None:
    # SGLang answers a request naming another model with the loaded model (no 404).
    r = client.post("/v1/completions", json={"model": "x", "prompt": "Hi"})
    assert r.status_code == 200 and r.json()["model"] == MODEL


def test_length_errors_use_sglang_wording(client: TestClient) -> None:
    # Clients and SGLang's own tests match on these messages word for word.
    r = client.post("/v1/completions", json={"prompt": "x" * 200, "max_tokens": 2})
    err = assert_error(r, 400)
    assert err["message"] == (
        "The input (201 tokens) is longer than the model's context length (128 tokens)."
    )
    r = client.post("/v1/completions", json={"prompt": "x" * 99, "max_tokens": 100})
    err = assert_error(r, 400)
    assert err["message"] == (
        "Requested token count exceeds the model's maximum context length of 128 tokens. "
        "You requested a total of 200 tokens: 100 tokens from the input messages and 100 "
        "tokens for the completion. Please reduce the number of tokens in the input messages "
        "or the completion to fit within the limit."
    )
    for field in ("max_tokens", "max_completion_tokens"):
        r = client.post("/v1/chat/completions", json={"messages": CHAT, field: 1200})
        err = assert_error(r, 400, field)
        assert err["message"] == (
            "max_completion_tokens is too large: 1200.This model supports at most 128 "
            "completion tokens."
        )
    assert_still_serving(client)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([1, "a"], "token_ids_logprob must be a list of integers."),
        ("5", "token_ids_logprob must be a list of integers."),
        ([1.5], "token_ids_logprob must be a list of integers."),
        ([5, 300], "Token id 300 in token_ids_logprob is outside the vocabulary [0, 300)."),
        ([-1], "Token id -1 in token_ids_logprob is outside the vocabulary [0, 300)."),
    ],
)
def test_generate_token_ids_logprob_errors(client: TestClient, value: Any, message: str) -> None:
    body = {
        "text": "Hi",
        "sampling_params": {"max_new_tokens": 2},
        "return_logprob": True,
        "token_ids_logprob": value,
    }
    err = assert_error(client.post("/generate", json=body), 400, "token_ids_logprob")
    assert err["message"] == message
    assert_still_serving(client)
