"""The web UI in a real browser (Debian's chromium driven by Playwright from PyPI, no browser
download at test time) against a real uvicorn serving the fake engine on 127.0.0.1: the page
loads, a reply streams in, a JSON reply is reported valid, a wrong API key gets a clear
message, and the dashboard's numbers move after a request. Screenshots go to
$RADIXSERVE_SCREENSHOT_DIR (default: the test's tmp folder)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from radixserve.entrypoints.http_server import create_app
from tests.helpers.thread_server import serve_app
from tests.unit.test_http_fakes import REPLY, FakeEngine, server_args

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

KEY = "browser-test-key"


def _chromium() -> str:
    path = os.environ.get("RADIXSERVE_CHROMIUM") or shutil.which("chromium")
    if not path:
        pytest.skip("no chromium executable (Debian: apt-get install chromium)")
    return path


@contextlib.contextmanager
def _server(engine: FakeEngine) -> Iterator[str]:
    with serve_app(create_app(engine, server_args(api_key=KEY))) as base:
        yield base


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("RADIXSERVE_SCREENSHOT_DIR") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def page() -> Iterator[Any]:
    executable = _chromium()
    with sync_api.sync_playwright() as pw:
        try:
            browser = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        except Exception as exc:  # a chromium that cannot start here is a missing browser
            pytest.skip(f"chromium did not start: {exc}")
        try:
            yield browser.new_page()
        finally:
            browser.close()


def _set(page: Any, selector: str, value: str) -> None:
    page.fill(selector, value)
    page.dispatch_event(selector, "change")


def _set_key(page: Any, key: str) -> None:
    _set(page, "#apikey", key)


def test_chat_streams_and_a_wrong_key_is_named(page: Any, shots: Path) -> None:
    with _server(FakeEngine(token_delay=0.02)) as base:
        page.goto(base + "/", wait_until="load")
        assert page.title() == "radixserve playground"
        _set(page, "#max_tokens", "40")  # the fake model's context is 128 tokens
        page.wait_for_selector("#banner:has-text('401')")  # no key typed yet
        _set_key(page, "wrong")
        page.fill("#input", "Hi")
        page.click("#send")
        page.wait_for_selector(".msg.error:has-text('API key')")
        page.screenshot(path=str(shots / "playground-wrong-key.png"))

        _set_key(page, KEY)
        page.wait_for_selector("#model:has-text('model:')")
        page.fill("#input", "Hello again")
        page.click("#send")
        # Part of the reply shows before the whole of it: the page renders as tokens arrive.
        page.wait_for_function(
            "() => { const m = [...document.querySelectorAll('.msg.assistant')].pop();"
            " return m && m.textContent.length > 0; }"
        )
        partial = page.locator(".msg.assistant").last.inner_text()
        page.wait_for_selector(".msg.assistant .stats:has-text('tokens/s')")
        final = page.locator(".msg.assistant").last.inner_text()
        assert REPLY in final and len(partial) < len(final)
        page.screenshot(path=str(shots / "playground-chat.png"))
        # The conversation survives a reload (localStorage); the key is not in the URL.
        page.reload(wait_until="load")
        assert REPLY in page.locator("#log").inner_text()
        assert KEY not in page.url


def test_json_reply_is_reported_valid(page: Any, shots: Path) -> None:
    engine = FakeEngine(reply='{"answer": "42"}')
    # The fake model writes its scripted JSON; a no-op grammar lets the request through.
    engine.tokenizer_manager._grammar_backend = SimpleNamespace(compile=lambda spec: None)
    with _server(engine) as base:
        page.goto(base + "/playground", wait_until="load")
        _set_key(page, KEY)
        _set(page, "#max_tokens", "40")
        page.select_option("#mode", "json_schema")
        page.dispatch_event("#mode", "change")
        page.fill("#constraint", '{"type": "object", "properties": {"answer": {"type": "string"}}}')
        page.fill("#input", "Answer in JSON")
        page.click("#send")
        page.wait_for_selector(".msg.assistant .stats:has-text('valid JSON')")
        assert "not valid" not in page.locator(".msg.assistant .stats").last.inner_text()
        page.screenshot(path=str(shots / "playground-json.png"))


def test_dashboard_numbers_move_under_load(page: Any, shots: Path) -> None:
    import httpx

    engine = FakeEngine(token_delay=0.01)
    engine.radix_tree = _sample_tree()
    with _server(engine) as base:
        page.goto(base + "/dashboard", wait_until="load")
        page.wait_for_selector("#banner:has-text('401')")
        _set_key(page, KEY)
        page.wait_for_function("() => document.getElementById('kv').textContent.endsWith('%')")
        chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 20, "stream": True}
        headers = {"Authorization": f"Bearer {KEY}"}
        with httpx.stream("POST", base + "/v1/chat/completions", json=chat, headers=headers) as r:
            r.read()
        # The next polls see the counters move: a positive tokens/s and a TTFT.
        page.wait_for_function(
            "() => parseFloat(document.getElementById('tps').textContent) > 0", timeout=15000
        )
        page.wait_for_function(
            "() => document.getElementById('ttft').textContent !== '-'", timeout=15000
        )
        # The radix tree is drawn: one box per shown node, the shared prefix spanning the row.
        shown = engine.radix_tree["shown"]
        page.wait_for_function(f"() => document.querySelectorAll('#tree .node').length >= {shown}")
        widths = page.eval_on_selector_all("#tree .node", "els => els.map(e => e.style.width)")
        assert widths[0] == "100%"
        assert "nodes" in page.text_content("#treesummary")
        page.screenshot(path=str(shots / "dashboard.png"), full_page=True)


def _sample_tree() -> dict[str, Any]:
    """A real RadixCache's snapshot: a shared system prompt with three conversations under it."""
    import torch

    from radixserve.mem_cache.radix_cache import RadixCache
    from radixserve.mem_cache.tree_snapshot import tree_snapshot

    cache = RadixCache()
    system = list(range(1, 41))
    for i, tail in enumerate(([50] * 30, [60] * 12 + [61] * 8, [70] * 6)):
        cache.insert(system + tail, torch.arange(i * 100, i * 100 + 40 + len(tail)))
    cache.inc_lock_ref(cache.match_prefix(system + [60] * 12 + [61] * 8).last_node)
    words = ["You", "are", "a", "helpful", "assistant", "who", "answers", "briefly"]
    return tree_snapshot(cache.root, decode=lambda ids: " ".join(words[i % 8] for i in ids))


def test_playground_sends_an_image_to_a_vision_model(page: Any, shots: Path) -> None:
    """With /model_info saying the model reads images, the image control shows; a picked file
    shows in the conversation and goes out as an image_url data URL part before the text; a
    pasted or dropped image joins the next message too."""
    import base64
    import json

    from tests.helpers.tiny_llava import png_bytes

    png = png_bytes(3, (64, 48))
    sent: list[dict[str, Any]] = []

    def model_info(route: Any) -> None:
        route.fulfill(json={"has_image_understanding": True})

    def chat(route: Any) -> None:
        sent.append(route.request.post_data_json)
        delta = {"choices": [{"index": 0, "delta": {"content": "A cat."}}]}
        route.fulfill(
            body=f"data: {json.dumps(delta)}\n\ndata: [DONE]\n\n",
            headers={"Content-Type": "text/event-stream"},
        )

    with _server(FakeEngine()) as base:
        page.route("**/model_info", model_info)
        page.route("**/v1/chat/completions", chat)
        page.goto(base + "/playground", wait_until="load")
        _set_key(page, KEY)
        page.wait_for_selector("#attach", state="visible")
        page.set_input_files(
            "#image", files=[{"name": "cat.png", "mimeType": "image/png", "buffer": png}]
        )
        page.wait_for_selector("#pending img")
        page.fill("#input", "What is this?")
        page.click("#send")
        page.wait_for_selector(".msg.assistant:has-text('A cat.')")
        assert page.locator(".msg.user img.thumb").count() == 1
        assert page.locator("#pending img").count() == 0
        url = "data:image/png;base64," + base64.b64encode(png).decode()
        assert sent[-1]["messages"][-1]["content"] == [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "What is this?"},
        ]
        page.screenshot(path=str(shots / "playground-image.png"))
        # Paste into the message box and drop on the conversation: both add an image.
        for event, target in (("paste", "#input"), ("drop", "main")):
            page.evaluate(
                """([event, target, b64]) => {
                    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
                    const dt = new DataTransfer();
                    dt.items.add(new File([bytes], "x.png", { type: "image/png" }));
                    const init = { bubbles: true, cancelable: true };
                    const e = event === "paste"
                        ? new ClipboardEvent("paste", { ...init, clipboardData: dt })
                        : new DragEvent("drop", { ...init, dataTransfer: dt });
                    document.querySelector(target).dispatchEvent(e);
                }""",
                [event, target, base64.b64encode(png).decode()],
            )
        page.wait_for_function("() => document.querySelectorAll('#pending img').length === 2")
        page.click("#send")  # images alone, no text
        page.wait_for_function("() => document.querySelectorAll('.msg.user img').length === 3")
        parts = sent[-1]["messages"][-1]["content"]
        assert [p["type"] for p in parts] == ["image_url", "image_url"]


def test_playground_hides_the_image_control_for_a_text_model(page: Any) -> None:
    with _server(FakeEngine()) as base:
        page.goto(base + "/playground", wait_until="load")
        # The fake engine's /model_info says has_image_understanding: false.
        with page.expect_response(lambda r: r.url.endswith("/model_info")) as info:
            _set_key(page, KEY)
        assert info.value.json()["has_image_understanding"] is False
        page.wait_for_selector("#model:has-text('model:')")
        assert page.locator("#attach").is_hidden()
