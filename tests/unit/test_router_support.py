"""What sglang-router reads from a worker, in the default run: /get_load in SGLang's shape (from
the scheduler's real load), and the /server_info and /model_info fields its worker discovery
parses. The router itself in front of two servers: tests/e2e/test_sglang_router.py (slow)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from radixserve import Engine
from radixserve.entrypoints.load_api import load_entries
from tests.unit.test_http_fakes import MODEL, FakeEngine, make_client
from tests.unit.tiny_model import write_tiny_llama


class LoadedFakeEngine(FakeEngine):
    def get_server_info(self) -> dict[str, Any]:
        return {**super().get_server_info(), "num_reqs": 3, "num_tokens": 120}


def test_load_entries_one_per_dp_rank() -> None:
    states = [{"num_reqs": 2, "num_waiting_reqs": 1, "num_tokens": 40}, {}]
    assert load_entries(states) == [
        {"dp_rank": 0, "num_reqs": 2, "num_waiting_reqs": 1, "num_tokens": 40},
        {"dp_rank": 1, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0},
    ]


def test_get_load_route_reports_the_schedulers_load() -> None:
    with make_client(LoadedFakeEngine()) as (client, _):
        r = client.get("/get_load")
    assert r.status_code == 200
    assert r.json() == [{"dp_rank": 0, "num_reqs": 3, "num_waiting_reqs": 0, "num_tokens": 120}]


def test_fields_the_router_discovers_workers_by() -> None:
    # The router's worker discovery reads model_path and served_model_name (plus tp_size and
    # dp_size, checked by the e2e test on a real server) from /server_info, model_type and
    # architectures from /model_info.
    with make_client() as (client, _):
        info = client.get("/server_info").json()
        model = client.get("/model_info").json()
    assert info["served_model_name"] == MODEL and info["model_path"] == MODEL
    assert model["architectures"] == ["FakeForCausalLM"]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama-load"))


def test_scheduler_load_counts_held_kv_and_ends_at_zero(tiny_model_dir: Path) -> None:
    engine = Engine(
        runtime="thread",
        model_path=str(tiny_model_dir),
        load_format="dummy",
        dtype="float32",
        skip_tokenizer_init=True,
        max_total_tokens=4096,
    )
    try:
        prompt = list(range(5, 45))
        stream = engine.generate(
            input_ids=prompt,
            sampling_params={"max_new_tokens": 50, "ignore_eos": True},
            stream=True,
        )
        next(stream)
        busy = engine.get_server_info()
        # The running request holds at least its prompt's KV.
        assert busy["num_reqs"] == 1 and busy["num_tokens"] >= len(prompt)
        for _ in stream:
            pass
        idle = engine.get_server_info()
        # Its KV stays cached (evictable), which is no load.
        assert idle["cached_tokens"] > 0
        assert idle["num_reqs"] == 0 and idle["num_tokens"] == 0
    finally:
        engine.shutdown()
