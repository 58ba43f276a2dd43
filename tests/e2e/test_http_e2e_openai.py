"""The real server with the default model, driven by the official `openai` client and httpx:
completions and chat (stream and not), usage, auth, bad input, abort on disconnect, metrics."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.e2e_server import ServerProcess, start_server

KEY = "e2e-secret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name three colors."}]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    # The legacy CUDA-graph spellings that broke `sglang serve` scripts must start for real.
    proc = start_server(
        "--api-key",
        KEY,
        "--enable-metrics",
        "--enable-cache-report",
        "--cuda-graph-max-bs",
        "8",
        "--disable-cuda-graph",
    )
    yield proc
    assert proc.stop() == 0, proc.logs()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def kv_idle(server: ServerProcess) -> bool:
    info = server.info(AUTH)
    free_or_cached = info["available_kv_tokens"] + info["cached_tokens"]
    return info["num_running_reqs"] == 0 and free_or_cached >= info["max_total_num_tokens"]


def wait_kv_idle(server: ServerProcess, within_s: float = 2.0) -> None:
    deadline = time.monotonic() + within_s
    while not kv_idle(server):
        assert time.monotonic() < deadline, server.info(AUTH)
        time.sleep(0.05)


def test_completion_stream_equals_non_stream(client: openai.OpenAI, model: str) -> None:
    kwargs: dict[str, Any] = {"model": model, "prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    full = client.completions.create(**kwargs, logprobs=1)
    text = full.choices[0].text
    assert text
    # usage: prompt tokens as the tokenizer counts them, one logprob per completion token
    tokens = httpx.post(f"{client.base_url}tokenize", json={"prompt": PROMPT}, headers=AUTH)
    assert full.usage is not None
    assert full.usage.prompt_tokens == tokens.json()["count"]
    assert full.usage.completion_tokens == len(full.choices[0].logprobs.tokens)
    stream = client.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_chat_stream_equals_non_stream(client: openai.OpenAI, model: str) -> None:
    kwargs: dict[str, Any] = {"model": model, "messages": CHAT, "max_tokens": 16, "temperature": 0}
    full = client.chat.completions.create(**kwargs, logprobs=True, top_logprobs=2)
    text = full.choices[0].message.content
    assert text
    assert full.usage is not None
    assert full.usage.completion_tokens == len(full.choices[0].logprobs.content)
    assert full.usage.prompt_tokens_details is not None  # --enable-cache-report
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason


def test_n_stop_and_extensions(client: openai.OpenAI, model: str) -> None:
    out = client.chat.completions.create(
        model=model,
        messages=CHAT,
        max_tokens=8,
        n=2,
        temperature=0.8,
        seed=1,
        extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.05, "min_tokens": 2},
    )
    assert [c.index for c in out.choices] == [0, 1]
    out = client.completions.create(model=model, prompt=PROMPT, max_tokens=1)
    assert out.choices[0].finish_reason == "length"
    out = client.completions.create(
        model=model, prompt="1, 2, 3, 4,", max_tokens=30, temperature=0, stop=[","]
    )
    assert "," not in out.choices[0].text
    assert out.choices[0].finish_reason == "stop"


def test_auth(server: ServerProcess, model: str) -> None:
    bad = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    assert httpx.get(f"{server.base_url}/get_model_info").status_code == 401


BAD_COMPLETIONS: list[dict[str, Any]] = [
    {"temperature": -1},
    {"top_p": 0},
    {"max_tokens": 0},
    {"max_tokens": 10**8},
    {"n": 0},
    {"prompt": "x " * 20000},
    {"prompt": [[1, 10**8]]},
    {"logit_bias": {"99999999": 1}},
    {"extra_body": {"top_k": 0}},
    {"extra_body": {"min_p": 3}},
    {"stop": ["x"] * 1000},
]


@pytest.mark.parametrize("bad", BAD_COMPLETIONS)
def test_bad_completion_then_good(client: openai.OpenAI, model: str, bad: dict[str, Any]) -> None:
    kwargs: dict[str, Any] = {"model": model, "prompt": PROMPT, "max_tokens": 2, **bad}
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(**kwargs)
    assert info.value.status_code == 400
    assert client.completions.create(model=model, prompt=PROMPT, max_tokens=2).choices[0].text


def test_bad_chat_and_another_model_name(client: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=[], max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=model,
            messages=[{"role": "wizard", "content": "hi"}],
            max_tokens=2,  # type: ignore[list-item]
        )
    # Another model name is served by the loaded model, as SGLang does (issue 31).
    other = client.chat.completions.create(model="no-such-model", messages=CHAT, max_tokens=2)
    assert other.choices and other.model == model
    assert client.chat.completions.create(model=model, messages=CHAT, max_tokens=2).choices


@pytest.mark.parametrize(
    ("raw", "ctype", "status"),
    [
        (b"{oops", "application/json", 400),
        (b'{"prompt": "\xff"}', "application/json", 400),
        (b'{"prompt": "hi"}', "text/plain", 415),
        (b'{"prompt": "' + b"a" * (33 * 1024 * 1024) + b'"}', "application/json", 413),
    ],
)
def test_raw_bad_bodies(server: ServerProcess, raw: bytes, ctype: str, status: int) -> None:
    r = httpx.post(
        f"{server.base_url}/v1/completions",
        content=raw,
        headers={**AUTH, "Content-Type": ctype},
        timeout=60,
    )
    assert r.status_code == status
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    ok = httpx.post(
        f"{server.base_url}/v1/completions",
        json={"prompt": PROMPT, "max_tokens": 2},
        headers=AUTH,
        timeout=60,
    )
    assert ok.status_code == 200


def test_stream_disconnect_frees_kv(server: ServerProcess) -> None:
    wait_kv_idle(server, within_s=10)
    body = {"prompt": PROMPT, "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with httpx.stream(
        "POST", f"{server.base_url}/v1/completions", json=body, headers=AUTH, timeout=60
    ) as r:
        lines = r.iter_lines()  # kept referenced: a collected iterator closes the connection
        first = next(line for line in lines if line.startswith("data: {"))
        assert json.loads(first[len("data: ") :])["choices"]
        assert server.info(AUTH)["num_running_reqs"] == 1
    wait_kv_idle(server, within_s=2.0)


def test_non_stream_disconnect_frees_kv(server: ServerProcess) -> None:
    wait_kv_idle(server, within_s=10)
    body = {"prompt": PROMPT, "max_tokens": 2000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/v1/completions", json=body, headers=AUTH, timeout=1.0)
    wait_kv_idle(server, within_s=2.0)


def test_metrics_are_open_and_counted(server: ServerProcess) -> None:
    text = httpx.get(f"{server.base_url}/metrics").text
    for name in (
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
        "sglang:time_to_first_token_seconds_bucket",
        "sglang:num_running_reqs",
        "sglang:token_usage",
        "sglang:cache_hit_rate",
    ):
        assert name in text
    line = next(ln for ln in text.splitlines() if ln.startswith("sglang:generation_tokens_total"))
    assert float(line.split()[-1]) > 0


def test_structured_outputs_through_the_openai_client(client: openai.OpenAI, model: str) -> None:
    import jsonschema

    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "population": {"type": "integer"},
        },
        "required": ["city", "population"],
        "additionalProperties": False,
    }
    messages = [{"role": "user", "content": "Describe a city as JSON."}]
    response_format: Any = {
        "type": "json_schema",
        "json_schema": {"name": "city", "schema": schema},
    }
    # Greedy: with random sampling the 135M model can write an integer of many digits and run
    # out of tokens mid-JSON (a valid prefix, but not a whole document).
    out = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=80,
        response_format=response_format,
        temperature=0,
    )
    jsonschema.validate(json.loads(out.choices[0].message.content or ""), schema)
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=80,
        response_format=response_format,
        stream=True,
        temperature=0,
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(streamed), schema)
    date = client.completions.create(
        model=model, prompt="Today is", max_tokens=16, extra_body={"regex": r"\d{4}-\d{2}-\d{2}"}
    )
    assert len(date.choices[0].text) == 10 and date.choices[0].text[4] == "-"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(
            model=model, prompt="x", max_tokens=4, extra_body={"regex": "([a-z"}
        )
    assert info.value.status_code == 400


def test_two_round_tool_loop_with_the_openai_client(client: openai.OpenAI, model: str) -> None:
    """The standard tool loop, exactly as the openai client sends it: a forced call, then the
    call sent back (assistant content null + tool_calls) with the tool's result; the second
    round answers, streamed and not."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "add",
                "parameters": {
                    "type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"],
                },
            },
        }
    ]
    messages: list[Any] = [{"role": "user", "content": "What is 2 + 3? Use the add tool."}]
    first = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "add"}},
        parallel_tool_calls=False,
        max_tokens=48,
        temperature=0,
    )
    message = first.choices[0].message
    assert message.tool_calls and message.tool_calls[0].function.name == "add"
    messages.append(message.model_dump(exclude_unset=True))  # content None + tool_calls
    messages.append({"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "5"})
    second = client.chat.completions.create(
        model=model, messages=messages, tools=tools, max_tokens=12, temperature=0
    )
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
    stream = client.chat.completions.create(
        model=model, messages=messages, tools=tools, max_tokens=12, temperature=0, stream=True
    )
    finishes = [c.choices[0].finish_reason for c in stream if c.choices]
    assert finishes[-1] in ("stop", "length", "tool_calls")


@pytest.mark.slow  # 35-50 s on a busy 2-core machine (a grammar-forced call among them)
def test_responses_api_with_the_openai_client(client: openai.OpenAI, model: str) -> None:
    """client.responses.create: plain (greedy stream equals non-stream), then a tool round (a
    forced call, its function_call_output sent back) and a stored response fetched by id."""
    plain = client.responses.create(
        model=model, input="Name three colors.", max_output_tokens=8, temperature=0
    )
    assert plain.status == "incomplete" and plain.output_text
    assert plain.usage is not None and plain.usage.output_tokens == 8
    events = list(
        client.responses.create(
            model=model,
            input="Name three colors.",
            max_output_tokens=8,
            temperature=0,
            stream=True,
        )
    )
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == plain.output_text
    tool = {
        "type": "function",
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    }
    first = client.responses.create(
        model=model,
        input="What is 2 + 3? Use the add tool.",
        tools=[tool],
        tool_choice={"type": "function", "name": "add"},
        max_output_tokens=48,
        temperature=0,
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "add" and set(json.loads(call.arguments)) == {"a", "b"}
    second = client.responses.create(
        model=model,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "5"}],
        tools=[tool],
        max_output_tokens=4,
        temperature=0,
    )
    assert second.status in ("completed", "incomplete")
    assert client.responses.retrieve(second.id).id == second.id
