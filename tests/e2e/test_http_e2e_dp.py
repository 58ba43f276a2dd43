"""`radixserve serve --dp-size 2` with the real default model over HTTP: concurrent requests
through the openai client are served by both replicas (visible in /get_server_info) with the
same greedy text as one replica; /metrics labels each replica; killing a replica ends the
server non-zero."""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.e2e_server import assert_last_child_kill_ends_server, start_server

PROMPTS = [f"Count from {i} to {i + 5}:" for i in range(6)]


def _complete(client: openai.OpenAI, prompt: str) -> str:
    model = client.models.list().data[0].id
    reply = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0)
    return reply.choices[0].text


# Slow: two servers with the default model (one with two replicas) take minutes on 2 cores.
# The default run keeps the same checks on a tiny model (tests/unit/test_dp_engine.py).
@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_dp2_server_spreads_requests_answers_like_dp1_and_dies_with_a_replica() -> None:
    single = start_server()
    try:
        client = openai.OpenAI(base_url=f"{single.base_url}/v1", api_key="x", max_retries=0)
        expected = [_complete(client, p) for p in PROMPTS]
    finally:
        assert single.stop() == 0, single.logs()
    # INFO: the startup lines that say how the cores were assigned.
    server = start_server("--dp-size", "2", "--enable-metrics", "--log-level", "info")
    try:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            got = list(pool.map(lambda p: _complete(client, p), PROMPTS))
        assert got == expected
        info = server.info()
        states = info["internal_states"]
        assert [s["dp_rank"] for s in states] == [0, 1]
        assert all(s["num_routed_reqs"] > 0 for s in states), states
        metrics = httpx.get(f"{server.base_url}/metrics", timeout=30).text
        assert 'dp_rank="1"' in metrics
        startup = Path(server.log.name).read_text(errors="replace")
        assert "CPU cores: 2 data-parallel replicas, replica 0: CPUs" in startup
        # scheduler dp0, detokenizer, scheduler dp1: the last spawned is replica 1's scheduler
        assert_last_child_kill_ends_server(server, 3, "radixserve-scheduler-dp1", 60)
    finally:
        server.stop(signal.SIGKILL)
