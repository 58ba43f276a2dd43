"""A local HTTP server on 127.0.0.1 that serves test images (the tests have no internet): each
path maps to a Route (status, headers, body, an optional delay before the body, or a redirect)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Route:
    body: bytes = b""
    content_type: str | None = "image/png"
    status: int = 200
    location: str | None = None  # a redirect target (status 302 unless set)
    delay_s: float = 0.0  # sleep before sending the body (timeouts)
    # False: no Content-Length, the body streamed until the connection closes (a cap must then
    # be enforced on the bytes that arrive).
    send_length: bool = True
    hits: list[float] = field(default_factory=list)


class ImageServer:
    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        routes = self.routes

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep test output quiet
                pass

            def do_GET(self) -> None:
                route = routes.get(self.path)
                if route is None:
                    self.send_error(404)
                    return
                route.hits.append(time.monotonic())
                if route.location is not None:
                    self.send_response(route.status if route.status != 200 else 302)
                    self.send_header("Location", route.location)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(route.status)
                if route.content_type:
                    self.send_header("Content-Type", route.content_type)
                if route.send_length:
                    self.send_header("Content-Length", str(len(route.body)))
                else:
                    self.close_connection = True
                self.end_headers()
                if route.delay_s:
                    time.sleep(route.delay_s)
                # The client may stop reading early (the size cap).
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(route.body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


@contextmanager
def image_server() -> Iterator[ImageServer]:
    server = ImageServer()
    thread = threading.Thread(target=server.httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()


def closed_port_url() -> str:
    """An http URL on 127.0.0.1 where nothing listens (connection refused)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/cat.png"
