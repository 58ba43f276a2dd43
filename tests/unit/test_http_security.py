"""Security on a fake engine (issue 11): request-supplied chat templates, request body size,
request-supplied paths, admin routes under an admin key, keys kept out of every log line."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from radixserve.options.errors import ServerArgsError
from radixserve.options.validate import validate
from tests.unit.test_http_errors import assert_error
from tests.unit.test_http_fakes import FakeTokenizer, make_client

CHAT = [{"role": "user", "content": "Hi"}]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _prompt_text(engine: Any) -> str:
    ids = engine.calls[-1]["input_ids"]
    ids = ids[0] if ids and isinstance(ids[0], list) else ids
    return FakeTokenizer().decode(ids)


def test_request_chat_template_is_refused() -> None:
    with make_client() as (client, engine):
        body = {"messages": CHAT, "chat_template_kwargs": {"chat_template": "PWNED {{ 7 * 6 }}"}}
        r = client.post("/v1/chat/completions", json=body)
        assert_error(r, 400, param="chat_template_kwargs.chat_template")
        assert engine.calls == []
        # Other template variables still pass through.
        body = {"messages": CHAT, "chat_template_kwargs": {"enable_thinking": False}}
        assert client.post("/v1/chat/completions", json=body).status_code == 200


def test_operator_may_allow_request_chat_templates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXSERVE_ALLOW_REQUEST_CHAT_TEMPLATE", "1")
    with make_client() as (client, engine):
        body = {"messages": CHAT, "chat_template_kwargs": {"chat_template": "MINE {{ 7 * 6 }}"}}
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        assert _prompt_text(engine).startswith("MINE 42")


@pytest.mark.parametrize(
    "key", ["tokenize", "add_generation_prompt", "return_dict", "tokenizer_kwargs"]
)
def test_server_owned_template_arguments_are_refused(key: str) -> None:
    with make_client() as (client, engine):
        body = {"messages": CHAT, "chat_template_kwargs": {key: True}}
        assert_error(
            client.post("/v1/chat/completions", json=body), 400, f"chat_template_kwargs.{key}"
        )
        assert engine.calls == []


def test_max_payload_size_option_gives_413() -> None:
    with make_client(max_payload_size=1000) as (client, _):
        assert_error(client.post("/v1/completions", json={"prompt": "x" * 2000}), 413)
        assert_error(client.post("/generate", json={"text": "x" * 2000}), 413)
        assert client.post("/v1/completions", json={"prompt": "x" * 100}).status_code == 200


def test_max_payload_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="--max-payload-size"), make_client(max_payload_size=0):
        pass


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/load_lora_adapter", {"lora_name": "x", "lora_path": "../../../../root/.ssh"}),
        ("/unload_lora_adapter", {"lora_name": "../../x"}),
    ],
)
def test_request_supplied_paths_are_never_opened(path: str, body: dict[str, Any]) -> None:
    """Routes that would take a path from the request are not served: with the admin key the
    answer is a plain 404 that echoes no path; without it, 401 before anything is read."""
    with make_client(admin_api_key="adm") as (client, _):
        assert_error(client.post(path, json=body), 401)
        r = client.post(path, json=body, headers=bearer("adm"))
        assert_error(r, 404)
        assert "etc" not in r.text and "ssh" not in r.text and ".." not in r.text


@pytest.mark.parametrize(
    "url",
    ["/v1/models/../../../../etc/passwd", "/v1/models/..%2F..%2Fetc%2Fpasswd", "/v1/models/%2e%2e"],
)
def test_model_card_path_is_a_name_not_a_file(url: str) -> None:
    with make_client() as (client, _):
        r = client.get(url)
        assert r.status_code == 404, r.text
        assert "root:" not in r.text


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/flush_cache"),
        ("GET", "/flush_cache"),
        ("POST", "/abort_request"),
        ("POST", "/flush_cache/"),
    ],
)
def test_admin_routes_need_the_admin_key(method: str, path: str) -> None:
    with make_client(api_key="user", admin_api_key="adm") as (client, _):
        body = {"rid": "x"} if "abort" in path else None
        for headers in ({}, bearer("user"), bearer("wrong"), {"Authorization": "adm"}):
            r = client.request(method, path, json=body, headers=headers)
            assert_error(r, 401)
        r = client.request(method, path, json=body, headers=bearer("adm"))
        assert r.status_code in (200, 307), r.text


def test_keys_never_reach_any_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with make_client(api_key="user-key-123", admin_api_key="admin-key-456", log_requests=True) as (
        client,
        _,
    ):
        client.post("/v1/completions", json={"prompt": "a", "max_tokens": 1})
        client.post("/v1/completions", json={"prompt": "a"}, headers=bearer("wrong-key-789"))
        client.post("/v1/completions", json={"prompt": "a"}, headers=bearer("user-key-123"))
        client.post("/flush_cache", headers=bearer("admin-key-456"))
        client.post("/flush_cache", headers=bearer("user-key-123"))
        info = client.get("/get_server_info", headers=bearer("user-key-123"))
        assert info.status_code == 200
    for secret in ("user-key-123", "admin-key-456", "wrong-key-789"):
        assert secret not in caplog.text
        assert secret not in info.text


def test_max_payload_size_zero_is_refused_at_startup() -> None:
    with pytest.raises(ServerArgsError, match="max-payload-size"):
        validate({"max_payload_size": 0})
