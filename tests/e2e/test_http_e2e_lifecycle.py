"""The real server's limits and shutdown: --max-queued-requests answers 503 with Retry-After,
and SIGTERM drains in-flight requests (new ones and /health get 503) before exiting 0."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.e2e_server import ServerProcess, engine_children, start_server

LONG = {"prompt": "Once upon a time", "max_tokens": 100, "ignore_eos": True, "temperature": 0}
# Long enough to still be queued when the third request comes (a few seconds of decode).
QUEUED = {**LONG, "max_tokens": 40}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    # A long grace period: the machine may be busy, and the drain must not cut the stream.
    proc = start_server(
        "--max-running-requests",
        "1",
        "--max-queued-requests",
        "1",
        env={"RADIXSERVE_GRACEFUL_SHUTDOWN_TIMEOUT": "300"},
    )
    yield proc
    proc.stop(signal.SIGKILL)


def _post_in_thread(url: str, body: dict[str, Any], out: list[int]) -> threading.Thread:
    def run() -> None:
        out.append(httpx.post(url, json=body, timeout=300).status_code)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_queue_limit(server: ServerProcess) -> None:
    url = f"{server.base_url}/v1/completions"
    statuses: list[int] = []
    threads = [_post_in_thread(url, QUEUED, statuses) for _ in range(2)]
    deadline = time.monotonic() + 60
    while server.info()["num_inflight_http_reqs"] < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    r = httpx.post(url, json={"prompt": "hi", "max_tokens": 1}, timeout=30)
    assert r.status_code == 503
    assert r.headers["Retry-After"]
    assert r.json()["error"]["code"] == 503
    for thread in threads:
        thread.join(timeout=300)
    assert statuses == [200, 200]
    assert httpx.post(url, json={"prompt": "hi", "max_tokens": 1}, timeout=30).status_code == 200


def test_sigterm_drains_then_exits_zero(server: ServerProcess) -> None:
    url = f"{server.base_url}/v1/completions"
    result: dict[str, Any] = {}

    def stream() -> None:
        with httpx.stream("POST", url, json={**LONG, "stream": True}, timeout=300) as r:
            result["status"] = r.status_code
            result["body"] = "".join(r.iter_text())

    worker = threading.Thread(target=stream)
    worker.start()
    deadline = time.monotonic() + 60
    while server.info()["num_running_reqs"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert httpx.get(f"{server.base_url}/health", timeout=5).status_code == 503
    late = httpx.post(url, json={"prompt": "hi", "max_tokens": 1}, timeout=5)
    assert late.status_code == 503
    worker.join(timeout=300)
    assert result["status"] == 200
    assert result["body"].rstrip().endswith("data: [DONE]")
    assert '"finish_reason": "length"' in result["body"]
    assert server.proc.wait(timeout=60) == 0, server.logs()


def _self_signed_cert(folder: Path) -> tuple[Path, Path]:
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return key, cert


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_https_then_engine_death_gives_503_and_exit_1(tmp_path: Path) -> None:
    key, cert = _self_signed_cert(tmp_path)
    proc = start_server("--ssl-keyfile", str(key), "--ssl-certfile", str(cert), scheme="https")
    try:
        r = httpx.post(
            f"{proc.base_url}/v1/completions",
            json={"prompt": "hi", "max_tokens": 2},
            verify=False,
            timeout=60,
        )
        assert r.status_code == 200 and r.json()["choices"][0]["text"]
        spawned = engine_children(proc.proc.pid)
        assert spawned, "the engine runs no child process to kill"
        os.kill(spawned[0], signal.SIGKILL)
        saw_503 = False
        deadline = time.monotonic() + 30
        while proc.proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                r = httpx.get(f"{proc.base_url}/health", timeout=2, verify=False)
                saw_503 |= r.status_code == 503
            time.sleep(0.05)
        assert proc.proc.wait(timeout=30) != 0
        assert saw_503 or "engine died" in proc.logs()
    finally:
        proc.stop(signal.SIGKILL)
