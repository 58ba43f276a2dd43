"""The API process itself killed (SIGKILL) mid-stream: nothing is left behind.

The scheduler and detokenizer watch their parent; with the API process gone they must exit on
their own (no orphan holding the KV pool and the cores), every client's connection must end
(no client waits forever on a socket nobody owns) and the port must be free for a restart. A
tiny random model with a word-level tokenizer keeps the server's start to seconds.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.e2e_server import child_pids, start_server
from tests.helpers.tiny_models import save_word_tokenizer
from tests.unit.tiny_model import TINY_VOCAB, write_tiny_llama

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited; only its parent's wait is missing


async def _stream(client: httpx.AsyncClient, url: str, i: int) -> str:
    """How one long streamed request ended: 'transport' when its connection dropped."""
    body = {
        "text": f"w{3 + i} w{4 + i} w{5 + i}",
        "sampling_params": {"max_new_tokens": 900, "ignore_eos": True, "temperature": 0},
        "stream": True,
    }
    try:
        async with client.stream("POST", url, json=body) as response:
            async for _ in response.aiter_lines():
                pass
    except httpx.TransportError:
        return "transport"
    return "completed"


def test_killed_api_process_leaves_no_orphans_and_drops_every_client(tmp_path: Path) -> None:
    model_dir = write_tiny_llama(tmp_path / "tiny")
    save_word_tokenizer(model_dir, TINY_VOCAB)
    server = start_server("--model-path", str(model_dir), "--load-format", "dummy")
    try:
        children = child_pids(server.proc.pid)
        assert len(children) >= 2, children  # scheduler and detokenizer

        async def main() -> list[str]:
            async with httpx.AsyncClient(timeout=httpx.Timeout(60.0)) as client:
                url = f"{server.base_url}/generate"
                tasks = [asyncio.ensure_future(_stream(client, url, i)) for i in range(4)]
                deadline = time.monotonic() + 60
                while (await client.get(f"{server.base_url}/get_server_info")).json()[
                    "num_running_reqs"
                ] < 4:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
                os.kill(server.proc.pid, signal.SIGKILL)
                return list(await asyncio.wait_for(asyncio.gather(*tasks), timeout=30))

        outcomes = asyncio.run(main())
        # 900 tokens each cannot have finished in the moment before the kill.
        assert outcomes == ["transport"] * 4, outcomes
        assert server.proc.wait(timeout=10) == -signal.SIGKILL
        deadline = time.monotonic() + 15
        while any(_alive(c) for c in children):
            assert time.monotonic() < deadline, [c for c in children if _alive(c)]
            time.sleep(0.2)
        # No listener is left on the port: a restart can bind it (with SO_REUSEADDR, as uvicorn
        # does; the dropped connections may linger in TIME_WAIT).
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", server.port))
            sock.listen()
    finally:
        server.stop(signal.SIGKILL)
        for child in child_pids(server.proc.pid) if server.proc.poll() is None else []:
            os.kill(child, signal.SIGKILL)
