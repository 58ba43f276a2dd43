"""The decode side's health check of a prefill's bootstrap server: a busy server (connection
taken, answer late) is alive; a closed port or an error status is not."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from radixserve.disaggregation import kv_receiver


@pytest.fixture(autouse=True)
def short_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kv_receiver, "HEALTH_TIMEOUT_S", 0.2)


def test_a_server_that_accepts_but_answers_late_counts_as_alive() -> None:
    # A listening socket nobody reads from: the kernel completes the handshake, no answer.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        port = sock.getsockname()[1]
        assert kv_receiver._healthy(f"http://127.0.0.1:{port}")


def test_a_closed_port_is_not_alive() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert not kv_receiver._healthy(f"http://127.0.0.1:{port}")


class _Status(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def status_server() -> Iterator[HTTPServer]:
    server = HTTPServer(("127.0.0.1", 0), _Status)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("status,alive", [(200, True), (503, False)])
def test_status_decides(status_server: HTTPServer, status: int, alive: bool) -> None:
    _Status.status = status
    url = f"http://127.0.0.1:{status_server.server_address[1]}"
    assert kv_receiver._healthy(url) is alive
