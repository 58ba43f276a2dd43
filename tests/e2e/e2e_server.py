"""Start `python -m radixserve serve` as a subprocess on 127.0.0.1 for end-to-end tests.

Imported by the tests/e2e modules (one server per module keeps the suite to minutes).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = float(os.environ.get("RADIXSERVE_E2E_STARTUP_TIMEOUT", "600"))
# Small KV pool: the tests need little, and the machine is shared.
BASE_ARGS = ("--dtype", "float32", "--max-total-tokens", "16384", "--log-level", "warning")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    def __init__(
        self, *extra_args: str, env: dict[str, str] | None = None, scheme: str = "http"
    ) -> None:
        self.port = free_port()
        self.base_url = f"{scheme}://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - kept open for the process
            mode="w+", prefix="radixserve-e2e-", suffix=".log", delete=False
        )
        command = [
            sys.executable,
            "-m",
            "radixserve",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *BASE_ARGS,
            *extra_args,
        ]
        self.proc = subprocess.Popen(
            command,
            cwd=REPO,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )

    def logs(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-4000:]

    def wait_ready(self, headers: dict[str, str] | None = None) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                r = httpx.get(f"{self.base_url}/health", timeout=2, verify=False)
                if r.status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"server not ready after {STARTUP_TIMEOUT_S} s:\n{self.logs()}")

    def info(self, headers: dict[str, str] | None = None) -> dict[str, Any]:
        r = httpx.get(f"{self.base_url}/get_server_info", headers=headers, timeout=10, verify=False)
        r.raise_for_status()
        return r.json()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return int(self.proc.returncode)


def start_server(
    *extra_args: str, scheme: str = "http", env: dict[str, str] | None = None
) -> ServerProcess:
    server = ServerProcess(*extra_args, env=env, scheme=scheme)
    try:
        server.wait_ready()
    except BaseException:
        server.stop(signal.SIGKILL)
        raise
    return server


def child_pids(pid: int) -> list[int]:
    """The direct children of process `pid` (Linux /proc), in the order the kernel lists them."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found.extend(int(p) for p in (task / "children").read_text().split())
    return found


def engine_children(pid: int) -> list[int]:
    """The server's engine processes (scheduler, detokenizer, other ranks or replicas): the
    children multiprocessing spawned, in start order (the scheduler first)."""
    spawned = [
        c for c in child_pids(pid) if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()
    ]
    return sorted(spawned, key=_start_time)


def _start_time(pid: int) -> int:
    # Field 22 of /proc/<pid>/stat (clock ticks after boot); fields counted after the
    # parenthesised command name, which may itself hold spaces.
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def assert_last_child_kill_ends_server(
    server: ServerProcess, count: int, name: str, within_s: float
) -> None:
    """SIGKILL the last of the server's `count` engine processes (named `name`): the server
    must exit non-zero within `within_s`, logging that `name` exited unexpectedly."""
    spawned = engine_children(server.proc.pid)
    assert len(spawned) == count, spawned
    os.kill(spawned[-1], signal.SIGKILL)
    deadline = time.monotonic() + within_s
    while server.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert server.proc.returncode not in (None, 0), server.logs()
    assert f"{name} exited unexpectedly" in server.logs()
