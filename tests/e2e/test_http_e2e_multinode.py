"""Two "nodes" on 127.0.0.1, as SGLang users start them: `radixserve serve --tp-size 2 --nnodes 2
--node-rank 0|1 --dist-init-addr 127.0.0.1:PORT`. Node 0 serves HTTP with rank 0, node 1 runs
rank 1 only (no HTTP server); outputs equal one rank's; killing node 1 ends node 0 non-zero
within --dist-timeout, with a line saying why."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from radixserve import Engine
from tests.e2e.e2e_server import BASE_ARGS, REPO, ServerProcess, free_port
from tests.helpers.tiny_models import make_tiny_checkpoint, save_word_tokenizer

DIST_TIMEOUT_S = 20
PROMPT = [5, 6, 7, 8, 9]
GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-multinode")
    make_tiny_checkpoint(folder, "llama")
    save_word_tokenizer(folder)
    return folder


# Slow: an Engine, then three model-loading processes on 2 cores (1-3 minutes). The default run
# checks the rank numbering and the refused combinations (tests/unit/test_multinode.py).
@pytest.mark.slow
def test_two_nodes_answer_like_one_rank_and_node_0_dies_with_node_1(tiny_dir: Path) -> None:
    with Engine(runtime="thread", model_path=str(tiny_dir), dtype="float32") as single:
        expected = single.generate(input_ids=PROMPT, sampling_params=GREEDY)["output_ids"]
    addr = f"127.0.0.1:{free_port()}"
    common = ["--model-path", str(tiny_dir), "--tp-size", "2", "--nnodes", "2"]
    common += ["--dist-init-addr", addr, "--dist-timeout", str(DIST_TIMEOUT_S)]
    node1_port = free_port()  # given to node 1, which must not serve on it
    node1_log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - kept open for the process
        mode="w+", prefix="radixserve-node1-", suffix=".log", delete=False
    )
    node1 = subprocess.Popen(
        [sys.executable, "-m", "radixserve", "serve", *BASE_ARGS, *common]
        + ["--node-rank", "1", "--host", "127.0.0.1", "--port", str(node1_port)],
        cwd=REPO,
        stdout=node1_log,
        stderr=subprocess.STDOUT,
    )
    node0 = ServerProcess(*common, "--node-rank", "0")
    try:
        node0.wait_ready()
        r = httpx.post(
            f"{node0.base_url}/generate",
            json={"input_ids": PROMPT, "sampling_params": GREEDY},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        assert r.json()["output_ids"] == expected
        info = node0.info()
        assert (info["tp_size"], info["nnodes"], info["node_rank"]) == (2, 2, 0)
        assert node1.poll() is None
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{node1_port}/health", timeout=5)
        node1.send_signal(signal.SIGKILL)  # the whole node: its rank dies with it
        node1.wait(timeout=30)
        deadline = time.monotonic() + DIST_TIMEOUT_S + 30
        while node0.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        logs = node0.logs()
        assert node0.proc.returncode not in (None, 0), logs
        assert "TP rank 0: lost contact with the other ranks" in logs, logs
        assert "radixserve-scheduler exited unexpectedly" in logs, logs
    finally:
        node0.stop(signal.SIGKILL)
        if node1.poll() is None:
            node1.kill()
            node1.wait()
        node1_log.close()
