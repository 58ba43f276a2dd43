"""Server behaviour on a fake engine: auth, queue limit, disconnects, readiness, draining,
engine death, logging, and a real SIGTERM drain of a uvicorn subprocess."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import httpx
import pytest

from radixserve.entrypoints import http_server
from radixserve.entrypoints.http_server import create_app
from radixserve.entrypoints.openai.errors import ApiError
from tests.unit.test_http_fakes import MODEL, FakeEngine, make_client, server_args

GOOD = {"prompt": "Hi", "max_tokens": 3}
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# -- auth --------------------------------------------------------------------------------------
def test_api_key_guards_all_but_health_and_metrics() -> None:
    with make_client(api_key="k1", enable_metrics=True) as (client, _):
        for headers in ({}, bearer("wrong"), {"Authorization": "k1"}):
            r = client.get("/v1/models", headers=headers)
            assert r.status_code == 401
            assert r.json()["error"]["type"] == "authentication_error"
            assert client.post("/generate", json={"text": "Hi"}, headers=headers).status_code == 401
        assert client.get("/v1/models", headers=bearer("k1")).status_code == 200
        assert client.post("/v1/completions", json=GOOD, headers=bearer("k1")).status_code == 200
        assert client.get("/health").status_code == 200
        assert client.get("/health_generate").status_code == 200
        assert client.get("/metrics").status_code == 200
        # Admin routes take the API key when no admin key is set.
        assert client.post("/flush_cache", headers=bearer("k1")).status_code == 200
        assert client.post("/flush_cache").status_code == 401


def test_admin_key_only_guards_admin_routes() -> None:
    with make_client(admin_api_key="adm") as (client, _):
        assert client.get("/v1/models").status_code == 200
        assert client.post("/flush_cache").status_code == 401
        assert client.post("/abort_request", json={"rid": "x"}).status_code == 401
        assert client.post("/flush_cache", headers=bearer("adm")).status_code == 200


def test_both_keys_follow_sglang_table() -> None:
    with make_client(api_key="k1", admin_api_key="adm") as (client, _):
        assert client.post("/flush_cache", headers=bearer("k1")).status_code == 401
        assert client.post("/flush_cache", headers=bearer("adm")).status_code == 200
        assert client.get("/v1/models", headers=bearer("k1")).status_code == 200
        assert client.get("/v1/models", headers=bearer("adm")).status_code == 401


def test_request_log_never_contains_the_key(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with make_client(api_key="top-secret-key", log_requests=True) as (client, _):
        r = client.post(
            "/v1/completions",
            json={"prompt": "log me", "max_tokens": 2},
            headers=bearer("top-secret-key"),
        )
        assert r.status_code == 200
    text = caplog.text
    assert "log me" in text and "Finish:" in text
    assert "top-secret-key" not in text


# -- queue limit ---------------------------------------------------------------------------------
async def _queue_scenario() -> None:
    engine = FakeEngine(gate=asyncio.Event())
    app = create_app(engine, server_args(max_queued_requests=1))
    app.state.ctx.state.ready = True
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        first = asyncio.create_task(client.post("/v1/completions", json=GOOD))
        while app.state.ctx.state.inflight < 1:
            await asyncio.sleep(0.01)
        r = await client.post("/v1/completions", json=GOOD)
        assert r.status_code == 503
        assert r.headers["Retry-After"] == "1"
        assert "queue is full" in r.json()["error"]["message"]
        assert engine.gate is not None
        engine.gate.set()
        assert (await first).status_code == 200
        assert app.state.ctx.state.inflight == 0
        assert (await client.post("/v1/completions", json=GOOD)).status_code == 200
        # One request of two samples needs two slots.
        r = await client.post("/v1/completions", json={**GOOD, "n": 2})
        assert r.status_code == 503


def test_queue_limit_answers_503_with_retry_after() -> None:
    asyncio.run(_queue_scenario())


# -- disconnects ---------------------------------------------------------------------------------
async def _call_and_disconnect(
    app: Any, path: str, body: dict[str, Any], disconnect_after_bytes: bool
) -> list[dict[str, Any]]:
    """Drive the ASGI app by hand: the client goes away after the first body bytes (stream)
    or after 0.3 s (non-stream)."""
    raw = json.dumps(body).encode()
    sent: list[dict[str, Any]] = []
    gone = asyncio.Event()
    requested = False

    if not disconnect_after_bytes:
        asyncio.get_running_loop().call_later(0.3, gone.set)

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await gone.wait()  # returns at once when set, even under a cancelled scope
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            gone.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }
    await asyncio.wait_for(app(scope, receive, send), timeout=5)
    return sent


@pytest.mark.parametrize("stream", [False, True])
def test_client_disconnect_aborts_the_request(stream: bool) -> None:
    async def scenario() -> None:
        engine = FakeEngine(token_delay=0.05)
        app = create_app(engine, server_args())
        body = {"prompt": "Hi", "max_tokens": 60, "ignore_eos": True, "stream": stream}
        await _call_and_disconnect(app, "/v1/completions", body, disconnect_after_bytes=stream)
        deadline = time.monotonic() + 2
        while engine.active and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert not engine.active
        assert len(engine.aborted) == 1
        assert app.state.ctx.state.inflight == 0

    asyncio.run(scenario())


# -- readiness, draining, engine death -------------------------------------------------------------
def test_health_is_503_until_warmup_finishes() -> None:
    engine = FakeEngine(gate=asyncio.Event())
    with make_client(engine, skip_server_warmup=False) as (client, _):
        r = client.get("/health")
        assert r.status_code == 503 and r.json()["error"]["code"] == 503
        assert engine.gate is not None
        client.portal.call(engine.gate.set)  # type: ignore[union-attr]
        deadline = time.monotonic() + 2
        while client.get("/health").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.get("/health").status_code == 200
        assert engine.calls[0]["prompt"] == "The capital city of France is"


def test_draining_refuses_new_work() -> None:
    with make_client() as (client, _):
        client.app.state.ctx.state.draining = True  # type: ignore[attr-defined]
        assert client.get("/health").status_code == 503
        assert client.get("/health_generate").status_code == 503
        r = client.post("/v1/completions", json=GOOD)
        assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"]


def test_failed_warmup_marks_the_server_dead() -> None:
    with make_client(FakeEngine(fail_after=0), skip_server_warmup=False) as (client, _):
        deadline = time.monotonic() + 2
        while client.app.state.ctx.state.dead_reason is None and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.01)
        assert client.get("/health").status_code == 503


def test_dead_engine_makes_health_503(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_server, "ENGINE_WATCH_S", 0.02)
    engine = FakeEngine()
    with make_client(engine) as (client, _):
        state = client.app.state.ctx.state  # type: ignore[attr-defined]
        assert client.get("/health").status_code == 200
        engine.alive = False
        assert client.get("/health").status_code == 503  # asked directly, at once
        deadline = time.monotonic() + 2
        while state.dead_reason is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert state.dead_reason == "engine died"  # the watcher noticed too
        assert client.post("/v1/completions", json=GOOD).status_code == 503


def test_launch_server_exits_nonzero_when_engine_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("no weights")

    fake_module = types.SimpleNamespace(Engine=broken)
    monkeypatch.setitem(sys.modules, "radixserve.entrypoints.engine", fake_module)
    with pytest.raises(SystemExit) as info:
        http_server.launch_server(server_args())
    assert info.value.code == 1


def test_bad_chat_template_option_is_refused() -> None:
    with pytest.raises(ValueError, match="--chat-template"):
        create_app(FakeEngine(), server_args(chat_template="no-such-template-name"))


def test_ssl_options_must_come_together() -> None:
    app = create_app(FakeEngine(), server_args())
    config = http_server.HttpConfig.from_server_args(server_args(ssl_keyfile="k.pem"))
    with pytest.raises(ValueError, match="--ssl-certfile"):
        http_server._uvicorn_config(app, config)


# -- SIGTERM on a real uvicorn process ----------------------------------------------------------
SERVER_SCRIPT = """
import sys
from tests.unit.test_http_fakes import FakeEngine, server_args
from radixserve.entrypoints import http_server
app = http_server.create_app(FakeEngine(token_delay=0.05), server_args(port={port}))
config = http_server._uvicorn_config(app, app.state.ctx.config)
http_server.DrainingServer(config, app.state.ctx).run()
sys.exit(0)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_sigterm_drains_in_flight_requests_then_exits_zero() -> None:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER_SCRIPT.format(port=port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        result: dict[str, Any] = {}

        def stream() -> None:
            body = {
                "model": MODEL,
                "prompt": "Hi",
                "max_tokens": 30,
                "ignore_eos": True,
                "stream": True,
            }
            with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=20) as r:
                result["text"] = "".join(r.iter_text())

        worker = threading.Thread(target=stream)
        worker.start()
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        assert httpx.get(f"{base}/health", timeout=2).status_code == 503
        worker.join(timeout=20)
        assert result["text"].rstrip().endswith("data: [DONE]")
        assert result["text"].count('"text"') >= 30
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_running_capacity_comes_from_the_engine() -> None:
    with make_client(max_queued_requests=2) as (client, _):
        deadline = time.monotonic() + 2
        state = client.app.state.ctx.state  # type: ignore[attr-defined]
        while state.running_capacity == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert state.running_capacity == 4  # FakeEngine reports max_running_requests=4
        tickets = [state.admit(1) for _ in range(6)]  # 4 running + 2 queued
        with pytest.raises(ApiError) as info:
            state.admit(1)
        assert info.value.status_code == 503
        tickets[0].release()
        tickets[0].release()  # idempotent
        state.admit(1)
        assert state.inflight == 6


def test_cors_preflight_passes_auth() -> None:
    with make_client(api_key="k") as (client, _):
        r = client.options(
            "/v1/completions",
            headers={"Origin": "http://example.com", "Access-Control-Request-Method": "POST"},
        )
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] in ("*", "http://example.com")


def test_body_schemas_are_computed_once_and_handed_out_as_copies() -> None:
    from radixserve.entrypoints import openapi_bodies
    from radixserve.entrypoints.openai.protocol import GenerateReqInput

    first = openapi_bodies.body_schema(GenerateReqInput)
    first["properties"].clear()
    assert openapi_bodies.body_schema(GenerateReqInput)["properties"]
    assert openapi_bodies._body_schema.cache_info().hits >= 1
    http_server.prepare()  # builds every router without an engine
