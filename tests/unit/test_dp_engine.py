"""--dp-size 2 end to end in processes: two replicas give the same greedy tokens as one engine,
requests spread per --load-balance-method (seen in /get_server_info's per-replica states),
aborts reach the right replica, the HTTP routes cover every replica, and a killed replica
fails its requests once and turns /health to 503."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixserve import Engine
from radixserve.entrypoints.http_server import create_app
from tests.helpers.tiny_models import make_tiny_checkpoint

GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
PROMPTS = [
    [5, 6, 7, 8],
    [5, 6, 7, 8, 9, 10, 11],
    [12] * 20,
    list(range(30, 60)),
    [9, 10, 11],
]
LONG = {"max_new_tokens": 480, "ignore_eos": True}  # the tiny model's context is 512


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-dp")
    make_tiny_checkpoint(folder, "llama")
    return folder


def engine_kwargs(folder: Path, **extra: Any) -> dict[str, Any]:
    return {
        "model_path": str(folder),
        "dtype": "float32",
        "skip_tokenizer_init": True,
        "max_total_tokens": 2048,
        "chunked_prefill_size": 16,
        "random_seed": 0,
        "skip_server_warmup": True,
        "enable_metrics": True,
        **extra,
    }


@pytest.fixture(scope="module")
def expected(checkpoint: Path) -> list[list[int]]:
    with Engine(runtime="thread", **engine_kwargs(checkpoint)) as single:
        return greedy(single)


@pytest.fixture(scope="module")
def dp_engine(checkpoint: Path) -> Iterator[Engine]:
    """One 2-replica engine for the whole module (each start costs seconds on 2 cores); the
    last test kills one of its replicas."""
    with Engine(dp_size=2, **engine_kwargs(checkpoint)) as engine:  # --load-balance-method auto
        yield engine


def greedy(engine: Engine) -> list[list[int]]:
    return [r["output_ids"] for r in engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)]


def routed(engine: Engine) -> list[int]:
    return [s["num_routed_reqs"] for s in engine.get_server_info()["internal_states"]]


def test_dp2_equals_one_engine_and_spreads_requests(
    dp_engine: Engine, expected: list[list[int]]
) -> None:
    names = [p.name for p in dp_engine.runtime.processes]
    assert names == [
        "radixserve-scheduler-dp0",
        "radixserve-detokenizer",
        "radixserve-scheduler-dp1",
    ]
    assert greedy(dp_engine) == expected
    assert greedy(dp_engine) == expected  # again, through each replica's radix cache
    # Five requests at once, twice: the fewest in flight (ties taking turns) spreads them.
    counts = routed(dp_engine)
    assert sum(counts) == 10 and min(counts) >= 3, counts
    info = dp_engine.get_server_info()
    states = info["internal_states"]
    assert [s["dp_rank"] for s in states] == [0, 1]
    assert all(s["prompt_tokens_total"] > 0 and s["num_inflight_reqs"] == 0 for s in states)
    assert info["prompt_tokens_total"] == sum(s["prompt_tokens_total"] for s in states)
    assert info["max_total_num_tokens"] == 2 * states[0]["max_total_num_tokens"]


def test_shared_prefix_goes_to_the_replica_that_cached_it(dp_engine: Engine) -> None:
    assert dp_engine.flush_cache() is True
    before = routed(dp_engine)
    prefix = list(range(40, 80))
    first = dp_engine.generate(input_ids=prefix + [3], sampling_params=GREEDY)
    second = dp_engine.generate(input_ids=prefix + [4, 4], sampling_params=GREEDY)
    assert first["meta_info"]["cached_tokens"] == 0
    assert second["meta_info"]["cached_tokens"] >= 32  # the same replica: a radix cache hit
    moved = [a - b for a, b in zip(routed(dp_engine), before, strict=True)]
    assert sorted(moved) == [0, 2]


def test_abort_by_rid_reaches_its_replica(dp_engine: Engine) -> None:
    keep = dp_engine.generate(input_ids=[5, 6, 7], sampling_params=LONG, stream=True, rid="keep")
    next(keep)
    stop = dp_engine.generate(input_ids=[5, 6, 7], sampling_params=LONG, stream=True, rid="stop")
    next(stop)
    ctl = dp_engine.runtime.controller
    assert {ctl.replica_of("keep"), ctl.replica_of("stop")} == {0, 1}
    dp_engine.abort_request(rid="stop")
    stopped = list(stop)
    assert stopped[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    kept = list(keep)
    assert kept[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert sum(len(c["output_ids"]) for c in kept) == LONG["max_new_tokens"] - 1  # after next()
    # Both replicas freed everything: their pools are whole again (free + cached).
    for state in dp_engine.get_server_info()["internal_states"]:
        assert state["num_running_reqs"] == 0 and state["num_inflight_reqs"] == 0
        assert state["available_kv_tokens"] + state["cached_tokens"] == 2048


def test_http_routes_cover_every_replica(dp_engine: Engine) -> None:
    with TestClient(create_app(dp_engine, dp_engine.server_args)) as client:
        deadline = time.monotonic() + 10  # the app marks itself ready on its event loop
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline, client.get("/health").text
            time.sleep(0.05)
        r = client.post("/generate", json={"input_ids": [5, 6, 7, 8], "sampling_params": GREEDY})
        assert r.status_code == 200 and len(r.json()["output_ids"]) == 12
        info = client.get("/get_server_info").json()
        assert [s["dp_rank"] for s in info["internal_states"]] == [0, 1]
        assert info["dp_size"] == 2
        metrics = client.get("/metrics").text
        for rank in (0, 1):
            assert f'sglang:num_running_reqs{{dp_rank="{rank}",model_name=' in metrics
        assert client.post("/flush_cache").status_code == 200
        states = client.get("/get_server_info").json()["internal_states"]
        assert [s["cached_tokens"] for s in states] == [0, 0]


def test_thread_runtime_refuses_dp(checkpoint: Path) -> None:
    with pytest.raises(ValueError, match="runtime='process'"):
        Engine(runtime="thread", dp_size=2, **engine_kwargs(checkpoint))


# Last: it kills one of the module engine's replicas.
def test_a_dead_replica_fails_requests_once_and_ends_the_engine(dp_engine: Engine) -> None:
    # One request on each replica (fewest in flight), then one replica dies: both requests end
    # once, the dead replica's with an abort, the engine is dead and /health says so. The other
    # replica's request ends with an abort too unless it finished its 480 tokens (a tiny model:
    # well under a second) before the runtime saw the death.
    streams = [
        dp_engine.generate(input_ids=ids, sampling_params=LONG, stream=True, rid=rid)
        for ids, rid in (([5, 6, 7], "on-a"), ([8, 9], "on-b"))
    ]
    for stream in streams:
        next(stream)
    ctl = dp_engine.runtime.controller
    victim = ctl.replica_of("on-b")
    assert {ctl.replica_of("on-a"), victim} == {0, 1}
    scheduler = next(p for p in dp_engine.runtime.processes if p.name.endswith(f"dp{victim}"))
    os.kill(scheduler.pid, signal.SIGKILL)
    for rid, stream in zip(("on-a", "on-b"), streams, strict=True):
        chunks = list(stream)
        finishes = [c for c in chunks if c["meta_info"]["finish_reason"] is not None]
        assert len(finishes) == 1 and chunks[-1] is finishes[0], rid
        reason = finishes[0]["meta_info"]["finish_reason"]["type"]
        if rid == "on-b":
            assert reason == "abort"
        else:
            assert reason in ("abort", "length")
            if reason == "length":
                assert finishes[0]["meta_info"]["completion_tokens"] == LONG["max_new_tokens"]
    deadline = time.monotonic() + 10
    while dp_engine.is_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not dp_engine.is_alive()
    with TestClient(create_app(dp_engine, dp_engine.server_args)) as client:
        assert client.get("/health").status_code == 503
    with pytest.raises(RuntimeError):
        dp_engine.generate(input_ids=[5, 6], sampling_params=GREEDY)


# Slow: five processes (two replicas of two TP ranks, the detokenizer) on 2 cores take minutes.
@pytest.mark.slow
def test_dp2_of_tp2_equals_one_engine(checkpoint: Path, expected: list[list[int]]) -> None:
    kwargs = engine_kwargs(checkpoint, dist_timeout=60, load_balance_method="total_tokens")
    with Engine(dp_size=2, tp_size=2, **kwargs) as engine:
        names = [p.name for p in engine.runtime.processes]
        assert names[-2:] == ["radixserve-scheduler-dp1", "radixserve-dp1-tp-rank-1"]
        assert greedy(engine) == expected
        assert all(count > 0 for count in routed(engine))
