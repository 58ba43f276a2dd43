"""`radixserve serve --pp-size 2` over HTTP: a tiny 3-layer checkpoint with a word tokenizer,
split over two pipeline stages, answers like one rank; killing the second stage's process ends
the server non-zero within --dist-timeout."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest

from radixserve import Engine
from tests.e2e.e2e_server import assert_last_child_kill_ends_server, start_server
from tests.e2e.test_http_e2e_tp import DIST_TIMEOUT_S, GREEDY, PROMPT, _generate
from tests.helpers.tiny_models import make_tiny_checkpoint, save_word_tokenizer


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-pp-http")
    make_tiny_checkpoint(folder, "llama", num_hidden_layers=3)
    save_word_tokenizer(folder)
    return folder


# Slow: 1-3 minutes on 2 cores (an Engine plus a 2-stage server). The default run keeps the
# greedy check at the engine level (tests/unit/test_pp_engine.py).
@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_pp2_server_answers_like_one_rank_and_dies_with_a_stage(tiny_dir: Path) -> None:
    with Engine(runtime="thread", model_path=str(tiny_dir), dtype="float32") as single:
        expected = single.generate(input_ids=PROMPT, sampling_params=GREEDY)["output_ids"]
    server = start_server(
        "--model-path",
        str(tiny_dir),
        "--pp-size",
        "2",
        "--pp-max-micro-batch-size",
        "1",
        "--dist-timeout",
        str(DIST_TIMEOUT_S),
    )
    try:
        assert _generate(server.base_url) == expected
        r = httpx.post(
            f"{server.base_url}/v1/completions",
            json={"prompt": ["w5 w6", "w7 w8 w9"], "max_tokens": 4, "temperature": 0},
            timeout=120,
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
        # scheduler (stage 0), detokenizer, stage 1: the last spawned is stage 1
        assert_last_child_kill_ends_server(
            server, 3, "radixserve-pp-1-tp-0-rank-1", DIST_TIMEOUT_S + 30
        )
    finally:
        server.stop(signal.SIGKILL)
