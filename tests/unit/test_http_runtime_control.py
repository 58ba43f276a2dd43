"""SGLang's runtime controls through HTTP on a real (tiny) engine: /abort_request,
/pause_generation + /continue_generation in each mode, priority preemption, and the waiting and
running time limits. Every request ends once, and the KV pool is whole afterwards."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixserve import Engine
from tests.unit.tiny_model import write_tiny_llama
from tests.unit.tiny_server import assert_kv_idle, tiny_client

PROMPT = [5, 17, 42, 99, 7, 311, 64, 8]
OTHER = [9, 33, 150, 12, 77, 401]
LONG = {"temperature": 0, "max_new_tokens": 600, "ignore_eos": True}
SHORT = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def pool() -> Any:
    with ThreadPoolExecutor(4) as executor:
        yield executor


def post(client: TestClient, body: dict[str, Any], path: str = "/generate") -> Any:
    return client.post(path, json=body)


def submit(pool: ThreadPoolExecutor, client: TestClient, body: dict[str, Any]) -> Future[Any]:
    return pool.submit(post, client, body)


def wait_until(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def running(engine: Engine) -> int:
    return len(engine.scheduler.running)


def greedy(client: TestClient, ids: list[int], params: dict[str, Any]) -> list[int]:
    r = post(client, {"input_ids": ids, "sampling_params": params})
    assert r.status_code == 200, r.text
    return list(r.json()["output_ids"])


# -- abort ---------------------------------------------------------------------------------------
def test_abort_request_by_rid_and_all(model_dir: Path, pool: ThreadPoolExecutor) -> None:
    with tiny_client(model_dir) as (client, engine):
        victim = submit(pool, client, {"input_ids": PROMPT, "sampling_params": LONG, "rid": "v1"})
        wait_until(lambda: running(engine) == 1)
        assert client.post("/abort_request", json={"rid": "v1"}).status_code == 200
        meta = victim.result(timeout=30).json()["meta_info"]
        assert meta["finish_reason"]["type"] == "abort"
        assert meta["completion_tokens"] < LONG["max_new_tokens"]
        # abort_all ends running and waiting requests alike.
        client.post("/pause_generation", json={"mode": "in_place"})
        futures = [
            submit(pool, client, {"input_ids": p, "sampling_params": LONG}) for p in (PROMPT, OTHER)
        ]
        wait_until(lambda: len(engine.scheduler.waiting) == 2)
        assert client.post("/abort_request", json={"abort_all": True}).status_code == 200
        for fut in futures:
            assert fut.result(timeout=30).json()["meta_info"]["finish_reason"]["type"] == "abort"
        client.post("/continue_generation")
        assert client.post("/abort_request", json={}).status_code == 400
        assert client.post("/abort_request", json={"rid": "no-such"}).status_code == 200
        assert_kv_idle(engine)


# -- pause / continue ----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["in_place", "retract"])
def test_pause_keeps_requests_and_continue_finishes_them_unchanged(
    model_dir: Path, pool: ThreadPoolExecutor, mode: str
) -> None:
    params = {**LONG, "max_new_tokens": 120}
    with tiny_client(model_dir) as (client, engine):
        expected = greedy(client, PROMPT, params)
        fut = submit(pool, client, {"input_ids": PROMPT, "sampling_params": params})
        wait_until(lambda: running(engine) == 1)
        r = client.post("/pause_generation", json={"mode": mode})
        assert r.status_code == 200 and r.json()["success"] is True
        sched = engine.scheduler
        if mode == "in_place":
            assert len(sched.running) == 1 and sched.running[0].req_pool_idx is not None
            req = sched.running[0]
        else:  # retract: the request gave its KV back and waits
            assert not sched.running and len(sched.waiting) == 1
            req = sched.waiting[0]
            assert req.req_pool_idx is None
        made = len(req.output_ids)
        # A request arriving meanwhile waits too.
        late = submit(pool, client, {"input_ids": OTHER, "sampling_params": SHORT})
        time.sleep(0.2)
        assert len(req.output_ids) == made and not fut.done() and not late.done()
        assert client.get("/server_info").json()["paused"] is True
        assert client.post("/continue_generation").status_code == 200
        result = fut.result(timeout=60).json()
        assert result["output_ids"] == expected
        assert result["meta_info"]["finish_reason"]["type"] == "length"
        assert result["meta_info"]["num_retractions"] == (1 if mode == "retract" else 0)
        assert late.result(timeout=30).json()["meta_info"]["finish_reason"]["type"] == "length"
        assert_kv_idle(engine)


def test_pause_abort_mode_ends_running_and_queues_new(
    model_dir: Path, pool: ThreadPoolExecutor
) -> None:
    with tiny_client(model_dir) as (client, engine):
        fut = submit(pool, client, {"input_ids": PROMPT, "sampling_params": LONG})
        wait_until(lambda: running(engine) == 1)
        assert client.post("/pause_generation", json={}).status_code == 200  # default: abort
        assert fut.result(timeout=30).json()["meta_info"]["finish_reason"]["type"] == "abort"
        late = submit(pool, client, {"input_ids": OTHER, "sampling_params": SHORT})
        time.sleep(0.3)
        assert not late.done()
        client.post("/continue_generation")
        assert late.result(timeout=30).status_code == 200
        assert_kv_idle(engine)


def test_pause_rejects_unknown_mode(model_dir: Path) -> None:
    with tiny_client(model_dir) as (client, engine):
        r = client.post("/pause_generation", json={"mode": "sideways"})
        assert r.status_code == 400 and "mode" in r.json()["error"]["message"]
        assert client.post("/pause_generation", json={"nope": 1}).status_code == 400
        assert engine.get_server_info()["paused"] is False


# -- priority ------------------------------------------------------------------------------------
def _priority_race(
    client: TestClient, engine: Engine, pool: ThreadPoolExecutor, high: int
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    done: list[str] = []

    def tracked(name: str, body: dict[str, Any]) -> dict[str, Any]:
        r = post(client, body)
        done.append(name)
        return dict(r.json())

    params = {**LONG, "max_new_tokens": 100}
    low_f = pool.submit(tracked, "low", {"input_ids": PROMPT, "sampling_params": params})
    wait_until(lambda: running(engine) == 1)
    # Freeze the running request so the race does not depend on the machine's speed.
    client.post("/pause_generation", json={"mode": "in_place"})
    high_f = pool.submit(
        tracked, "high", {"input_ids": OTHER, "sampling_params": SHORT, "priority": high}
    )
    wait_until(lambda: len(engine.scheduler.waiting) == 1)
    client.post("/continue_generation")
    return low_f.result(timeout=60), high_f.result(timeout=60), done


def test_higher_priority_preempts_a_running_request(
    model_dir: Path, pool: ThreadPoolExecutor
) -> None:
    params = {**LONG, "max_new_tokens": 100}
    with tiny_client(model_dir, enable_priority_scheduling=True, max_running_requests=1) as (
        client,
        engine,
    ):
        expected = greedy(client, PROMPT, params)
        low, high, order = _priority_race(client, engine, pool, high=100)
        assert order == ["high", "low"]
        assert low["meta_info"]["num_retractions"] >= 1
        assert low["output_ids"] == expected  # resumed from the cache, same greedy output
        assert high["meta_info"]["finish_reason"]["type"] == "length"
        # A difference within the threshold (10) does not preempt.
        low, high, order = _priority_race(client, engine, pool, high=5)
        assert order == ["low", "high"] and low["meta_info"]["num_retractions"] == 0
        assert_kv_idle(engine)


def test_disable_priority_preemption(model_dir: Path, pool: ThreadPoolExecutor) -> None:
    with tiny_client(
        model_dir,
        enable_priority_scheduling=True,
        disable_priority_preemption=True,
        max_running_requests=1,
    ) as (client, engine):
        low, _, order = _priority_race(client, engine, pool, high=100)
        assert order == ["low", "high"] and low["meta_info"]["num_retractions"] == 0


def test_abort_on_priority_when_disabled(model_dir: Path) -> None:
    with tiny_client(model_dir, abort_on_priority_when_disabled=True) as (client, engine):
        r = post(client, {"input_ids": PROMPT, "sampling_params": SHORT, "priority": 3})
        assert r.status_code == 400 and "priority is disabled" in r.json()["error"]["message"]
        assert post(client, {"input_ids": PROMPT, "sampling_params": SHORT}).status_code == 200
        bad = post(client, {"input_ids": PROMPT, "sampling_params": SHORT, "priority": "hi"})
        assert bad.status_code == 400
        assert_kv_idle(engine)


def test_priority_reaches_the_scheduler_from_openai_routes(model_dir: Path) -> None:
    with tiny_client(model_dir, abort_on_priority_when_disabled=True) as (client, _):
        r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, "priority": 1})
        assert r.status_code == 400 and "priority" in r.text


# -- time limits ---------------------------------------------------------------------------------
def test_waiting_timeout(
    model_dir: Path, pool: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SGLANG_REQ_WAITING_TIMEOUT", "0.2")
    with tiny_client(model_dir, max_running_requests=1) as (client, engine):
        first = submit(pool, client, {"input_ids": PROMPT, "sampling_params": LONG})
        wait_until(lambda: running(engine) == 1)
        r = post(client, {"input_ids": OTHER, "sampling_params": SHORT})
        assert r.status_code == 503
        assert r.json()["error"]["message"] == "Request waiting timeout reached."
        client.post("/abort_request", json={"abort_all": True})
        assert first.result(timeout=60).json()["meta_info"]["finish_reason"]["type"] == "abort"
        assert_kv_idle(engine)


def test_running_timeout(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_REQ_RUNNING_TIMEOUT", "0.3")
    with tiny_client(model_dir) as (client, engine):
        start = time.monotonic()
        big = {**LONG, "max_new_tokens": 1000}
        r = post(client, {"input_ids": PROMPT, "sampling_params": big, "stream": True})
        lines = [ln for ln in r.text.splitlines() if ln.startswith("data: {")]
        assert "Request running timeout reached." in lines[-1]
        assert time.monotonic() - start < 20
        assert post(client, {"input_ids": PROMPT, "sampling_params": SHORT}).status_code == 200
        assert_kv_idle(engine)


# -- auth ----------------------------------------------------------------------------------------
def test_control_routes_need_the_admin_key(model_dir: Path) -> None:
    with tiny_client(model_dir, admin_api_key="adm") as (client, _):
        for path in ("/pause_generation", "/continue_generation", "/abort_request"):
            assert (
                client.post(path, json={"abort_all": True} if "abort" in path else {}).status_code
                == 401
            )
        auth = {"Authorization": "Bearer adm"}
        assert (
            client.post("/pause_generation", json={"mode": "in_place"}, headers=auth).status_code
            == 200
        )
        assert client.post("/continue_generation", headers=auth).status_code == 200
        # Sessions are NORMAL routes in SGLang: no admin key needed.
        assert client.post("/open_session", json={}).status_code == 200
