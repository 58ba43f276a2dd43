"""The web UI: the playground at / (for browsers) and /playground, the dashboard and its state
route, same-origin assets only, --disable-web-ui, and how the pages sit behind --api-key."""

from __future__ import annotations

import re

import pytest

from tests.unit.test_http_fakes import MODEL, make_client

BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
PAGES = ("/playground", "/dashboard")


def test_browser_gets_the_playground_at_root() -> None:
    with make_client() as (client, _):
        r = client.get("/", headers={"Accept": BROWSER})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert "radixserve playground" in r.text and "v1/chat/completions" in r.text


@pytest.mark.parametrize("accept", [None, "application/json", "*/*"])
def test_other_clients_keep_the_json_pointer_at_root(accept: str | None) -> None:
    headers = {"Accept": accept} if accept else {}
    with make_client() as (client, _):
        r = client.get("/", headers=headers)
    assert r.status_code == 200 and r.json()["name"] == "radixserve"


@pytest.mark.parametrize("path", PAGES)
def test_pages_are_html_with_same_origin_assets_only(path: str) -> None:
    with make_client() as (client, _):
        r = client.get(path)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "connect-src 'self'" in r.headers["content-security-policy"]
    # No CDN: nothing loads from another host, no protocol-relative URLs either.
    assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", r.text, re.IGNORECASE)
    assert not re.search(r"<(script|link)[^>]+(src|href)=", r.text, re.IGNORECASE)


def test_playground_keeps_the_key_out_of_the_url() -> None:
    with make_client() as (client, _):
        text = client.get("/playground").text
    assert '"Authorization"' in text and "Bearer " in text
    assert not re.search(r"[?&](api_?key|key|token)=", text)


def test_dashboard_state_has_the_fields_the_page_reads() -> None:
    with make_client() as (client, engine):
        engine.active["someone"] = 100  # one running request holding 100 KV tokens
        body = client.get("/dashboard/state").json()
    assert body["model"] == MODEL and body["engine_reachable"] is True
    gauges = body["gauges"]
    assert gauges["num_running_reqs"] == 1 and gauges["num_queue_reqs"] == 0
    assert gauges["num_used_tokens"] == 100 and gauges["max_total_num_tokens"] == 1000
    assert gauges["token_usage"] == pytest.approx(0.1)
    assert set(body["totals"]) >= {"generation_tokens_total", "ttft_seconds_sum", "ttft_count"}
    assert body["radix_tree"] is None  # the fake engine has no radix cache
    assert body["role"] is None  # not a PD prefill or decode server


def test_dashboard_state_carries_the_engine_radix_tree() -> None:
    tree = {"tokens": 9, "nodes": 1, "shown": 1, "root": {"children": [], "other_tokens": 0}}
    with make_client() as (client, engine):
        engine.radix_tree = tree
        body = client.get("/dashboard/state").json()
    assert body["radix_tree"] == tree


def test_dashboard_counters_move_after_a_streamed_chat() -> None:
    chat = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 5,
        "stream": True,
    }
    with make_client() as (client, _):
        before = client.get("/dashboard/state").json()["totals"]
        with client.stream("POST", "/v1/chat/completions", json=chat) as r:
            assert r.status_code == 200
            r.read()
        after = client.get("/dashboard/state").json()["totals"]
    assert after["generation_tokens_total"] - before["generation_tokens_total"] == 5
    assert after["ttft_count"] == before["ttft_count"] + 1


def test_web_routes_stay_out_of_the_openapi_document() -> None:
    with make_client() as (client, _):
        paths = client.get("/openapi.json").json()["paths"]
    assert not {"/playground", "/dashboard", "/dashboard/state"} & set(paths)


@pytest.mark.parametrize("path", [*PAGES, "/dashboard/state"])
def test_disable_web_ui_answers_404(path: str) -> None:
    with make_client(disable_web_ui=True) as (client, _):
        r = client.get(path, headers={"Accept": BROWSER})
    assert r.status_code == 404
    assert r.json()["error"]["code"] == 404


def test_disable_web_ui_leaves_the_json_pointer_for_browsers() -> None:
    with make_client(disable_web_ui=True) as (client, _):
        r = client.get("/", headers={"Accept": BROWSER})
    assert r.status_code == 200 and r.json()["name"] == "radixserve"


@pytest.mark.parametrize("keys", [{"api_key": "k1"}, {"admin_api_key": "adm", "api_key": "k1"}])
def test_pages_load_without_a_key_but_their_data_needs_it(keys: dict[str, str]) -> None:
    with make_client(**keys) as (client, _):
        for path in PAGES:
            assert client.get(path).status_code == 200
        assert client.get("/", headers={"Accept": BROWSER}).status_code == 200
        assert client.get("/").status_code == 401  # the JSON pointer keeps its auth
        assert client.get("/dashboard/state").status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert client.get("/dashboard/state", headers=wrong).status_code == 401
        good = {"Authorization": "Bearer k1"}
        assert client.get("/dashboard/state", headers=good).status_code == 200
        assert client.get("/v1/models").status_code == 401


def test_disabled_web_ui_opens_nothing_behind_a_key() -> None:
    with make_client(api_key="k1", disable_web_ui=True) as (client, _):
        assert client.get("/", headers={"Accept": BROWSER}).status_code == 401
        assert client.get("/playground").status_code == 401


def test_playground_has_the_image_control() -> None:
    """The image input (file pick, paste, drop) is in the page, hidden until /model_info says
    the model reads images, and sends images as image_url parts (the browser test drives it)."""
    with make_client() as (client, _):
        text = client.get("/playground").text
        info = client.get("/model_info").json()
    assert re.search(r'<button id="attach" hidden', text)
    assert re.search(r'<input id="image" type="file" accept="image/\*"', text)
    assert "has_image_understanding" in text and 'type: "image_url"' in text
    assert '"paste"' in text and '"drop"' in text
    assert info["has_image_understanding"] is False  # the fake engine reads text only
