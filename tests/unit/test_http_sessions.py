"""SGLang's sessions through HTTP on a real (tiny) engine: a continuation equals a fresh
request on the concatenated tokens at temperature 0, its prefix is a cache hit (the session
keeps it locked), branches, offset, drop_previous_output and replace, and closing unlocks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.unit.tiny_model import write_tiny_llama
from tests.unit.tiny_server import assert_kv_idle, tiny_client

GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
TURN1 = [5, 17, 42, 99, 7, 311, 64, 8, 21, 400]
TURN2 = [33, 150, 12]
TURN3 = [77, 401, 250, 3]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def gen(client: TestClient, ids: list[int], **extra: Any) -> dict[str, Any]:
    r = client.post("/generate", json={"input_ids": ids, "sampling_params": GREEDY, **extra})
    assert r.status_code == 200, r.text
    return dict(r.json())


def fresh(client: TestClient, ids: list[int]) -> list[int]:
    return list(gen(client, ids)["output_ids"])


def test_session_continuation_branching_and_close(model_dir: Path) -> None:
    # The fresh references run on a separate engine, so they cannot warm the session's cache.
    with tiny_client(model_dir) as (ref, _):
        first_ref = fresh(ref, TURN1)
        second_ref = fresh(ref, TURN1 + first_ref + TURN2)
        branch_ref = fresh(ref, TURN1 + first_ref + TURN3)
        nested_ref = fresh(ref, TURN1 + first_ref + TURN2 + second_ref + TURN3)
        offset_ref = fresh(ref, TURN1[:4] + TURN3)
        dropped_ref = fresh(ref, TURN1 + TURN2)
    with tiny_client(model_dir) as (client, engine):
        sid = client.post("/open_session", json={"capacity_of_str_len": 1000}).json()
        assert isinstance(sid, str) and sid

        def turn(ids: list[int], new_rid: str, **params: Any) -> dict[str, Any]:
            return gen(client, ids, rid=new_rid, session_params={"id": sid, **params})

        first = turn(TURN1, "r1")
        assert first["output_ids"] == first_ref
        second = turn(TURN2, "r2", rid="r1")
        assert second["output_ids"] == second_ref
        meta = second["meta_info"]
        # Everything r1 computed (its prompt and all but its last output token) was reused.
        assert meta["cached_tokens"] == len(TURN1) + len(first_ref) - 1
        assert meta["prompt_tokens"] == len(TURN1) + len(first_ref) + len(TURN2)
        # A second branch from the same point, and a continuation of a continuation.
        assert turn(TURN3, "r3", rid="r1")["output_ids"] == branch_ref
        nested = turn(TURN3, "r4", rid="r2")
        assert nested["output_ids"] == nested_ref
        assert nested["meta_info"]["cached_tokens"] >= len(TURN1) + len(first_ref) + len(TURN2)
        assert turn(TURN3, "r5", rid="r1", offset=4)["output_ids"] == offset_ref
        assert turn(TURN2, "r6", rid="r1", drop_previous_output=True)["output_ids"] == dropped_ref
        # The saved points stay locked: flushing the cache is refused while the session is open.
        assert client.post("/flush_cache").status_code == 400
        assert engine.scheduler.kv.prefix_cache.protected_size() > 0
        assert client.post("/close_session", json={"session_id": sid}).status_code == 200
        assert engine.scheduler.kv.prefix_cache.protected_size() == 0
        assert client.post("/flush_cache").status_code == 200
        assert_kv_idle(engine)


def test_session_replace_drops_the_branches(model_dir: Path) -> None:
    with tiny_client(model_dir) as (client, engine):
        sid = client.post("/open_session", json={"session_id": "chat-1"}).json()
        assert sid == "chat-1"
        gen(client, TURN1, rid="a", session_params={"id": sid})
        gen(client, TURN2, rid="b", session_params={"id": sid, "rid": "a"})
        gen(client, TURN3, rid="c", session_params={"id": sid, "rid": "a", "replace": True})
        # "b" was cut off by the replace: continuing from it is refused.
        r = client.post(
            "/generate",
            json={"input_ids": TURN2, "session_params": {"id": sid, "rid": "b"}},
        )
        assert r.status_code == 400 and "not in session" in r.json()["error"]["message"]
        gen(client, TURN2, rid="d", session_params={"id": sid, "rid": "c"})
        client.post("/close_session", json={"session_id": sid})
        assert engine.scheduler.kv.prefix_cache.protected_size() == 0
        assert_kv_idle(engine)


@pytest.mark.parametrize(
    ("session_params", "needle"),
    [
        ({"id": "nope"}, "does not exist"),
        ({"id": "S", "rid": "ghost"}, "not in session"),
        ({"id": "S", "colour": 1}, "Unknown session_params"),
        ({"id": "S", "offset": "3"}, "offset"),
        ({"rid": "x"}, "session_params.id"),
    ],
)
def test_bad_session_params_answer_400(
    model_dir: Path, session_params: dict[str, Any], needle: str
) -> None:
    with tiny_client(model_dir) as (client, engine):
        client.post("/open_session", json={"session_id": "S"})
        r = client.post(
            "/generate",
            json={"input_ids": TURN1, "sampling_params": GREEDY, "session_params": session_params},
        )
        assert r.status_code == 400, r.text
        assert needle in r.json()["error"]["message"]
        assert_kv_idle(engine)


def test_session_routes_errors(model_dir: Path) -> None:
    with tiny_client(model_dir) as (client, _):
        assert client.post("/open_session", json={"session_id": "dup"}).status_code == 200
        r = client.post("/open_session", json={"session_id": "dup"})
        assert r.status_code == 400 and "already open" in r.json()["error"]["message"]
        assert client.post("/close_session", json={"session_id": "zzz"}).status_code == 400
        assert client.post("/close_session", json={}).status_code == 400
        assert client.post("/open_session", json={"capacity_of_str_len": 0}).status_code == 400


def test_session_survives_a_failed_step(model_dir: Path) -> None:
    """A crashed step resets the KV bookkeeping: the session forgets its (gone) locks, the
    request that died cannot be continued, and earlier saved points still can."""
    with tiny_client(model_dir) as (ref, _):
        expected = fresh(ref, TURN1 + fresh(ref, TURN1) + TURN3)
    with tiny_client(model_dir) as (client, engine):
        sid = client.post("/open_session", json={}).json()
        gen(client, TURN1, rid="ok", session_params={"id": sid})
        runner = engine.scheduler.step_runner
        real_run = runner.run

        def boom(*args: Any, **kwargs: Any) -> Any:
            runner.run = real_run
            raise RuntimeError("injected")

        runner.run = boom
        r = client.post(
            "/generate",
            json={"input_ids": TURN2, "rid": "dies", "session_params": {"id": sid, "rid": "ok"}},
        )
        assert r.status_code == 500
        r = client.post(
            "/generate",
            json={"input_ids": TURN2, "session_params": {"id": sid, "rid": "dies"}},
        )
        assert r.status_code == 400
        again = gen(client, TURN3, rid="again", session_params={"id": sid, "rid": "ok"})
        assert again["output_ids"] == expected
        assert client.post("/close_session", json={"session_id": sid}).status_code == 200
        assert_kv_idle(engine)
