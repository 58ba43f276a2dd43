"""`radixserve serve --tp-size 2` over HTTP: a tiny checkpoint with a word tokenizer, served by
two tensor-parallel ranks, answers like one rank; killing a rank ends the server non-zero."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest

from radixserve import Engine
from tests.e2e.e2e_server import assert_last_child_kill_ends_server, start_server
from tests.helpers.tiny_models import make_tiny_checkpoint, save_word_tokenizer

DIST_TIMEOUT_S = 20
PROMPT = [5, 6, 7, 8, 9]
GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-tp-http")
    make_tiny_checkpoint(folder, "llama")
    save_word_tokenizer(folder)
    return folder


def _generate(base_url: str) -> list[int]:
    body = {"input_ids": PROMPT, "sampling_params": GREEDY}
    r = httpx.post(f"{base_url}/generate", json=body, timeout=120)
    r.raise_for_status()
    return list(r.json()["output_ids"])


# Slow: 1-3 minutes on 2 cores (an Engine plus a 2-rank server). The default run keeps the same
# checks at the engine level (tests/unit/test_tp_engine.py: tp 2 == tp 1, a killed rank).
@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_tp2_server_answers_like_tp1_and_dies_with_a_rank(tiny_dir: Path) -> None:
    # One rank, in this process: the same checkpoint and the server's float32.
    with Engine(runtime="thread", model_path=str(tiny_dir), dtype="float32") as single:
        expected = single.generate(input_ids=PROMPT, sampling_params=GREEDY)["output_ids"]
    server = start_server(
        "--model-path", str(tiny_dir), "--tp-size", "2", "--dist-timeout", str(DIST_TIMEOUT_S)
    )
    try:
        assert _generate(server.base_url) == expected
        r = httpx.post(
            f"{server.base_url}/v1/completions",
            json={"prompt": "w5 w6", "max_tokens": 4, "temperature": 0},
            timeout=120,
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        # scheduler (rank 0), detokenizer, rank 1: the last spawned is TP rank 1
        assert_last_child_kill_ends_server(server, 3, "radixserve-tp-rank-1", DIST_TIMEOUT_S + 30)
    finally:
        server.stop(signal.SIGKILL)
