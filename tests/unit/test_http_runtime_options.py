"""Runtime options through HTTP on a real (tiny) engine: --skip-tokenizer-init answers,
--enable-request-time-stats-logging, --crash-dump-folder and --enable-cache-report."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from tests.unit.tiny_model import write_tiny_llama
from tests.unit.tiny_server import assert_kv_idle, tiny_client

PROMPT = [5, 17, 42, 99, 7, 311, 64, 8]
GREEDY = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def test_skip_tokenizer_init_answers_token_ids_without_text(model_dir: Path) -> None:
    with tiny_client(model_dir) as (client, _):  # tiny_client sets skip_tokenizer_init
        body = {"input_ids": PROMPT, "sampling_params": GREEDY}
        whole = client.post("/generate", json=body).json()
        assert "text" not in whole and len(whole["output_ids"]) == 4
        r = client.post("/generate", json={**body, "stream": True})
        chunks = [
            json.loads(line[len("data: ") :])
            for line in r.text.splitlines()
            if line.startswith("data: {")
        ]
        assert all("text" not in c for c in chunks)
        assert [len(c["output_ids"]) for c in chunks] == [1, 2, 3, 4]
        assert chunks[-1]["output_ids"] == whole["output_ids"]
        r = client.post("/generate", json={"text": "hi", "sampling_params": GREEDY})
        assert r.status_code == 400 and "tokenizer" in r.json()["error"]["message"]


def test_request_time_stats_logging(model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="radixserve.managers.request_stats")
    with tiny_client(model_dir, enable_request_time_stats_logging=True) as (client, _):
        client.post("/generate", json={"input_ids": PROMPT, "sampling_params": GREEDY, "rid": "t1"})
    lines = [r.getMessage() for r in caplog.records if "Req Time Stats" in r.getMessage()]
    assert len(lines) == 1
    assert "rid=t1" in lines[0] and "output len=4" in lines[0] and "queue_duration=" in lines[0]


def test_no_time_stats_without_the_option(
    model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="radixserve.managers.request_stats")
    with tiny_client(model_dir) as (client, _):
        client.post("/generate", json={"input_ids": PROMPT, "sampling_params": GREEDY})
    assert not [r for r in caplog.records if "Req Time Stats" in r.getMessage()]


def test_crash_dump_folder(model_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "dumps"
    with tiny_client(model_dir, crash_dump_folder=str(folder)) as (client, engine):
        client.post("/generate", json={"input_ids": PROMPT, "sampling_params": GREEDY, "rid": "a"})
        runner = engine.scheduler.step_runner
        real_run = runner.run

        def boom(*args: Any, **kwargs: Any) -> Any:
            runner.run = real_run  # fail once
            raise RuntimeError("injected")

        runner.run = boom
        r = client.post(
            "/generate", json={"input_ids": PROMPT[:5], "sampling_params": GREEDY, "rid": "b"}
        )
        assert r.status_code == 500
        dumps = list(folder.glob("crash_dump_*.json"))
        assert len(dumps) == 1
        data = json.loads(dumps[0].read_text())
        assert [req["rid"] for req in data["requests"]] == ["a", "b"]
        assert data["requests"][1]["input_ids"] == PROMPT[:5]
        assert "Internal error" in data["reason"]
        # The server keeps serving.
        ok = client.post("/generate", json={"input_ids": PROMPT, "sampling_params": GREEDY})
        assert ok.status_code == 200
        assert_kv_idle(engine)


@pytest.mark.parametrize("report", [True, False])
def test_cache_report_in_openai_usage(model_dir: Path, report: bool) -> None:
    with tiny_client(model_dir, enable_cache_report=report) as (client, _):
        body = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0}
        client.post("/v1/completions", json=body)
        usage = client.post("/v1/completions", json=body).json()["usage"]
        if report:
            assert usage["prompt_tokens_details"]["cached_tokens"] == len(PROMPT) - 1
        else:
            assert usage.get("prompt_tokens_details") is None
