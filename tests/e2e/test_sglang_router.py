"""SGLang's router (sglang-router, the `router` extra) in front of two radixserve servers on
127.0.0.1: completions and chat, streamed or not, pass through it with the outputs of a direct
request; both policies tried spread requests over both workers; a killed worker is dropped by
the router's health check and requests keep succeeding. The routes and fields the router reads
are also checked in the default run (tests/unit/test_router_support.py)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.e2e_server import ServerProcess, free_port, start_server
from tests.helpers.tiny_models import make_tiny_checkpoint, save_word_tokenizer

pytestmark = [
    pytest.mark.slow,  # two servers and two routers: about a minute on 2 cores
    pytest.mark.skipif(
        importlib.util.find_spec("sglang_router") is None,
        reason="sglang-router not installed (pip install 'radixserve[router]')",
    ),
]

MODEL = "tiny-router"
# The word tokenizer has no chat template: a plain one that joins the messages.
TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
PROMPTS = [f"w{a} w{b} w{c}" for a, b, c in ((5, 6, 7), (40, 41, 9), (90, 12, 3), (150, 7, 77))]
ROUTER_READY_S = 120.0
HEALTH_DROP_S = 60.0


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    folder = tmp_path_factory.mktemp(MODEL)
    make_tiny_checkpoint(folder, "llama")
    save_word_tokenizer(folder)
    template = folder / "chat.jinja"
    template.write_text(TEMPLATE)
    args = ("--model-path", str(folder), "--chat-template", str(template))
    args += ("--served-model-name", MODEL, "--enable-metrics")
    servers: list[ServerProcess] = []
    try:
        for _ in range(2):
            servers.append(start_server(*args))
        yield servers
    finally:
        for server in servers:
            server.stop(signal.SIGKILL)


class Router:
    def __init__(self, worker_urls: list[str], policy: str, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - kept open for the process
            mode="w+", prefix="sglang-router-", suffix=".log", delete=False
        )
        command = [
            sys.executable,
            "-m",
            "sglang_router.launch_router",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--worker-urls",
            *worker_urls,
            "--policy",
            policy,
            "--health-check-interval-secs",
            "1",
            "--health-failure-threshold",
            "1",
            # Its Prometheus exporter binds 29000 by default, maybe taken on a shared machine.
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(free_port()),
            "--log-level",
            "warn",
            *extra,
        ]
        self.proc = subprocess.Popen(
            command, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ}
        )

    def logs(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-4000:]

    def healthy_workers(self) -> set[str]:
        r = httpx.get(f"{self.url}/workers", timeout=5)
        r.raise_for_status()
        return {w["url"] for w in r.json()["workers"] if w["is_healthy"]}

    def wait_for(self, expected: set[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.logs()
            try:
                if self.healthy_workers() == expected:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"router workers never became {expected}:\n{self.logs()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def _client(base_url: str) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", timeout=120, max_retries=0)


def _outputs(base_url: str) -> list[str]:
    """Greedy completion and chat text for every prompt, plain and streamed."""
    client = _client(base_url)
    out: list[str] = []
    for prompt in PROMPTS:
        params: dict[str, Any] = {"model": MODEL, "max_tokens": 6, "temperature": 0}
        out.append(client.completions.create(prompt=prompt, **params).choices[0].text)
        stream = client.completions.create(prompt=prompt, stream=True, **params)
        out.append("".join(chunk.choices[0].text for chunk in stream if chunk.choices))
        messages = [{"role": "user", "content": prompt}]
        reply = client.chat.completions.create(messages=messages, **params)
        out.append(reply.choices[0].message.content or "")
        stream = client.chat.completions.create(messages=messages, stream=True, **params)
        out.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
    return out


def _burst(base_url: str) -> list[str]:
    """Concurrent greedy completions (in flight together, so load-based routing kicks in)."""
    client = _client(base_url)

    def one(prompt: str) -> str:
        reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0)
        return reply.choices[0].text

    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(one, PROMPTS * 2))


def _requests_served(server: ServerProcess) -> int:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("sglang:num_requests_total"):
            return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError(f"no sglang:num_requests_total in /metrics:\n{text[:2000]}")


# cache_aware sends a prompt without a cached match to a worker its prefix tree knows; a fresh
# router knows only the workers it has sent to, so sequential requests all go to the first one.
# It rebalances when in-flight loads differ by more than --balance-abs-threshold (64 by default):
# lowered here so that a burst of 8 concurrent requests spreads.
POLICIES = {
    "round_robin": (),
    "cache_aware": ("--balance-abs-threshold", "1", "--balance-rel-threshold", "1.0"),
}


@pytest.mark.parametrize("policy", list(POLICIES))
def test_router_in_front_of_two_servers(workers: list[ServerProcess], policy: str) -> None:
    expected = _outputs(workers[0].base_url)
    expected_burst = _burst(workers[0].base_url)
    assert all(text for text in expected)
    urls = [w.base_url for w in workers]
    router = Router(urls, policy, *POLICIES[policy])
    try:
        router.wait_for(set(urls), ROUTER_READY_S)
        models = httpx.get(f"{router.url}/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == [MODEL]
        before = [_requests_served(w) for w in workers]
        assert _outputs(router.url) == expected
        assert _burst(router.url) == expected_burst
        served = [_requests_served(w) - b for w, b in zip(workers, before, strict=True)]
        assert all(n > 0 for n in served), f"requests per worker: {served}"
        assert sum(served) == len(expected) + len(expected_burst)
        load = httpx.get(f"{workers[0].base_url}/get_load", timeout=10).json()
        assert load[0]["dp_rank"] == 0 and load[0]["num_reqs"] == 0
    finally:
        router.stop()


def test_router_drops_a_killed_worker(workers: list[ServerProcess]) -> None:
    expected = _outputs(workers[0].base_url)
    urls = [w.base_url for w in workers]
    router = Router(urls, "cache_aware")
    try:
        router.wait_for(set(urls), ROUTER_READY_S)
        workers[1].stop(signal.SIGKILL)
        router.wait_for({urls[0]}, HEALTH_DROP_S)
        assert _outputs(router.url) == expected
    finally:
        router.stop()
