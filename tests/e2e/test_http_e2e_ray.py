"""`radixserve serve --use-ray --tp-size 2`: the scheduler and tensor-parallel rank 1 run as
Ray actors on a local Ray cluster the server starts on this machine. Through the openai
client it answers with the same greedy text as the same server launched with multiprocessing;
SIGTERM leaves no process behind (Ray's included); a rank actor killed takes the server down
with a non-zero exit and a log line naming the rank.

Every process of the server carries a marker in its environment (Ray's GCS, raylet and
workers inherit the server's), so "nothing left" is checked by scanning /proc for it. A
private RAY_TMPDIR keeps the server off any other Ray cluster on the machine.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import openai
import pytest

from tests.e2e.e2e_server import ServerProcess, free_port, start_server
from tests.helpers.tiny_models import save_word_tokenizer
from tests.unit.tiny_model import TINY_VOCAB, write_tiny_llama

pytestmark = [
    pytest.mark.slow,  # a Ray cluster's start takes tens of seconds on 2 cores
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray"),
    pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc"),
]

PROMPTS = ["w3 w4 w5", "w10 w11", "w7 w7 w7 w7"]
MARKER = "RADIXSERVE_RAY_TEST"


def _marked(tag: str) -> dict[int, str]:
    """pid -> command line of every live process whose environment holds MARKER=tag."""
    needle = f"{MARKER}={tag}".encode()
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # ended meanwhile, or not ours to read
        if state != "Z":
            found[int(proc.name)] = cmdline
    return found


def _wait_none_marked(tag: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while (left := _marked(tag)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, left


def _complete(server: ServerProcess) -> list[str]:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)
    model = client.models.list().data[0].id
    texts = []
    for prompt in PROMPTS:
        reply = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0)
        texts.append(reply.choices[0].text)
    return texts


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = write_tiny_llama(tmp_path_factory.mktemp("tiny-ray") / "tiny")
    save_word_tokenizer(folder, TINY_VOCAB)
    return folder


def _ray_tmp(tag: str) -> Path:
    # A short temp dir: Ray puts unix sockets there (their paths are limited to ~107 bytes).
    return Path("/tmp") / f"rs-ray-{tag[:8]}"


def _cleanup(server: ServerProcess, tag: str) -> None:
    server.stop(signal.SIGKILL)
    for pid in _marked(tag):
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(_ray_tmp(tag), ignore_errors=True)  # Ray's session logs


def _ray_server(model_dir: Path, tag: str) -> ServerProcess:
    ray_tmp = _ray_tmp(tag)
    env = {MARKER: tag, "RAY_TMPDIR": str(ray_tmp), "RAY_USAGE_STATS_ENABLED": "0"}
    os.environ.pop("RAY_ADDRESS", None)  # a local cluster of its own, not the caller's
    return start_server(*_args(model_dir), "--use-ray", "--log-level", "info", env=env)


def _args(model_dir: Path) -> tuple[str, ...]:
    # A fixed seed: the dummy weights (and sampling) are drawn from it.
    return (
        "--model-path",
        str(model_dir),
        "--load-format",
        "dummy",
        "--tp-size",
        "2",
        "--random-seed",
        "0",
    )


def test_ray_tp2_answers_like_multiprocessing_and_leaves_nothing(
    model_dir: Path,
) -> None:
    plain = start_server(*_args(model_dir))
    try:
        expected = _complete(plain)
    finally:
        assert plain.stop() == 0, plain.logs()
    tag = uuid.uuid4().hex
    server = _ray_server(model_dir, tag)
    try:
        running = _marked(tag)
        # The ranks are Ray actors (Ray names its worker processes after the actor class),
        # under a raylet this server started.
        actors = [cmd for cmd in running.values() if cmd.startswith("ray::RankActor")]
        assert len(actors) == 2, running
        assert any("raylet" in cmd for cmd in running.values()), running
        assert _complete(server) == expected
        assert "Ray: started a local cluster" in Path(server.log.name).read_text(errors="replace")
        assert server.stop() == 0, server.logs()
        _wait_none_marked(tag)
    finally:
        _cleanup(server, tag)


def test_ray_rank_actor_killed_takes_the_server_down(model_dir: Path) -> None:
    tag = uuid.uuid4().hex
    server = _ray_server(model_dir, tag)
    try:
        actors = sorted(
            pid for pid, cmd in _marked(tag).items() if cmd.startswith("ray::RankActor")
        )
        assert len(actors) == 2
        os.kill(actors[-1], signal.SIGKILL)  # either rank's actor: losing any rank is fatal
        deadline = time.monotonic() + 120
        while server.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert server.proc.returncode not in (None, 0), server.logs()
        assert "its Ray actor died" in server.logs() or "exited unexpectedly" in server.logs()
        _wait_none_marked(tag)
    finally:
        _cleanup(server, tag)


def test_ray_server_killed_leaves_nothing(model_dir: Path) -> None:
    """SIGKILL on the API process: Ray's processes (started with it) and the rank actors with
    their rank processes all end on their own."""
    tag = uuid.uuid4().hex
    server = _ray_server(model_dir, tag)
    try:
        assert any(cmd.startswith("ray::RankActor") for cmd in _marked(tag).values())
        os.kill(server.proc.pid, signal.SIGKILL)
        _wait_none_marked(tag)
    finally:
        _cleanup(server, tag)


def test_ray_joins_a_running_cluster_and_leaves_it_running(model_dir: Path) -> None:
    """`ray start --head` first, then the server with RAY_ADDRESS: it joins that cluster (no
    cluster of its own), and SIGTERM removes its actors and rank processes but not the
    cluster, which belongs to whoever started it."""
    cluster_tag, server_tag = uuid.uuid4().hex, uuid.uuid4().hex
    ray_tmp = _ray_tmp(cluster_tag)
    gcs = f"127.0.0.1:{free_port()}"
    # A cluster started with `ray start` authenticates with a token its drivers must share.
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": uuid.uuid4().hex + uuid.uuid4().hex}
    env = {**os.environ, MARKER: cluster_tag, "RAY_TMPDIR": str(ray_tmp), **auth}
    env.pop("RAY_ADDRESS", None)
    ray_cli = Path(sys.executable).with_name("ray")
    head = [
        str(ray_cli), "start", "--head", "--node-ip-address", "127.0.0.1",
        "--port", gcs.rpartition(":")[2], "--num-cpus", "2", "--num-gpus", "0",
        "--object-store-memory", str(100 * 1024 * 1024), "--include-dashboard", "false",
        "--disable-usage-stats", "--temp-dir", str(ray_tmp),
    ]  # fmt: skip
    server = None
    try:
        subprocess.run(head, env=env, check=True, capture_output=True, timeout=180)
        server = start_server(
            *_args(model_dir),
            "--use-ray",
            "--log-level",
            "info",
            env={MARKER: server_tag, "RAY_ADDRESS": gcs, "RAY_TMPDIR": str(ray_tmp), **auth},
        )
        # The rank actors are workers of the running cluster (they carry its marker).
        in_cluster = _marked(cluster_tag)
        assert sum(cmd.startswith("ray::RankActor") for cmd in in_cluster.values()) == 2
        assert not any("raylet" in cmd for cmd in _marked(server_tag).values())
        assert len(_complete(server)) == len(PROMPTS)
        assert "Ray: joined the running cluster" in Path(server.log.name).read_text(
            errors="replace"
        )
        assert server.stop() == 0, server.logs()
        _wait_none_marked(server_tag)
        deadline = time.monotonic() + 30
        while True:
            left = _marked(cluster_tag).values()
            ranks = [c for c in left if c.startswith("ray::RankActor") or "spawn_main" in c]
            if not ranks or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert not ranks, ranks
        assert any("raylet" in cmd for cmd in left)  # the cluster itself still runs
    finally:
        if server is not None:
            server.stop(signal.SIGKILL)
        # `ray stop` would stop every Ray cluster on the machine: end only this one's processes.
        for pid in list(_marked(cluster_tag)) + list(_marked(server_tag)):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)
