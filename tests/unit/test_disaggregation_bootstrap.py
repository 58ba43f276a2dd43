"""The prefill bootstrap server (radixserve/disaggregation/bootstrap.py): SGLang's routes over
real HTTP, the rank registry, and the room table's expiry of never-claimed rooms."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from radixserve.disaggregation.bootstrap import (
    BOOTSTRAP_TIMEOUT_ENV,
    BootstrapServer,
    PrefillRankInfo,
    PrefillServerInfo,
    RegistrationError,
    RoomError,
    RoomTable,
    bootstrap_timeout_s,
    fetch_prefill_rank,
    fetch_prefill_server_info,
    register_prefill_rank,
)


def _rank(tp_rank: int, port: int, tp_size: int = 2, **extra: Any) -> dict[str, Any]:
    """A PUT /route body as SGLang's prefill ranks send it."""
    body: dict[str, Any] = {
        "attn_tp_size": tp_size,
        "attn_tp_rank": tp_rank,
        "attn_cp_size": 1,
        "attn_cp_rank": 0,
        "attn_dp_size": 1,
        "attn_dp_rank": 0,
        "pp_size": 1,
        "pp_rank": 0,
        "system_dp_size": 1,
        "system_dp_rank": 0,
        "rank_ip": "127.0.0.1",
        "rank_port": port,
        "page_size": 16,
        "kv_cache_dtype": "bfloat16",
    }
    body.update(extra)
    return body


@pytest.fixture
def server() -> Any:
    with BootstrapServer(host="127.0.0.1", port=0) as srv:
        yield srv


def test_routes_register_and_look_up_ranks(server: BootstrapServer) -> None:
    url = f"http://127.0.0.1:{server.port}"
    health = httpx.get(f"{url}/health", timeout=5)
    assert (health.status_code, health.text) == (200, "OK")

    # Nothing registered yet: the layout query waits (503) as SGLang's does.
    assert fetch_prefill_server_info(url) is None
    r = httpx.put(f"{url}/route", json=_rank(0, 17000), timeout=5)
    assert (r.status_code, r.text) == (200, "OK")
    assert fetch_prefill_server_info(url) is None  # tp 2: rank 1 still missing
    assert httpx.get(f"{url}/route", params=_query(0), timeout=5).status_code == 503

    register_prefill_rank(url, _rank(1, 17001))
    info = fetch_prefill_server_info(url)
    assert info == PrefillServerInfo(
        attn_tp_size=2,
        attn_cp_size=1,
        dp_size=1,
        pp_size=1,
        page_size=16,
        kv_cache_dtype="bfloat16",
        follow_bootstrap_room=True,
    )
    assert fetch_prefill_rank(url, 0, 0, 1, 0) == PrefillRankInfo("127.0.0.1", 17001)
    raw = httpx.get(f"{url}/route", params=_query(0), timeout=5)
    assert raw.json() == {"rank_ip": "127.0.0.1", "rank_port": 17000}
    assert fetch_prefill_rank(url, 0, 0, 5, 0) is None  # 404


def _query(tp: int) -> dict[str, int]:
    return {"prefill_dp_rank": 0, "prefill_cp_rank": 0, "target_tp_rank": tp, "target_pp_rank": 0}


def test_routes_refuse_bad_requests(server: BootstrapServer) -> None:
    url = f"http://127.0.0.1:{server.port}"
    missing = httpx.get(f"{url}/route", params={"prefill_dp_rank": 0}, timeout=5)
    assert missing.status_code == 400
    not_int = httpx.get(f"{url}/route", params={**_query(0), "target_tp_rank": "x"}, timeout=5)
    assert not_int.status_code == 400
    assert httpx.put(f"{url}/route", content=b"nope", timeout=5).status_code == 400
    no_ip = _rank(0, 1)
    del no_ip["rank_ip"]
    r = httpx.put(f"{url}/route", json=no_ip, timeout=5)
    assert r.status_code == 400 and "rank_ip" in r.text
    assert httpx.put(f"{url}/route", json=_rank(2, 1), timeout=5).status_code == 400  # tp 2 of 2
    register_prefill_rank(url, _rank(0, 1))
    with pytest.raises(RegistrationError, match="differs"):  # another page size
        register_prefill_rank(url, _rank(1, 2, page_size=32))
    assert httpx.post(f"{url}/route", json={}, timeout=5).status_code == 405


def test_port_in_use_fails_at_once(server: BootstrapServer) -> None:
    with pytest.raises(OSError):
        BootstrapServer(host="127.0.0.1", port=server.port)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_room_table_expires_unclaimed_rooms() -> None:
    clock = _Clock()
    freed: list[tuple[int, str]] = []
    rooms: RoomTable[str] = RoomTable(
        timeout_s=10, on_expire=lambda r, p: freed.append((r, p)), clock=clock
    )
    rooms.open(1, "pages-1")
    rooms.open(2, "pages-2")
    with pytest.raises(RoomError, match="already open"):
        rooms.open(1, "again")
    clock.now += 5
    assert rooms.claim(2) == "pages-2"
    with pytest.raises(RoomError, match="already claimed"):
        rooms.claim(2)
    clock.now += 5  # room 1 reaches its deadline unclaimed; room 2 is claimed
    with pytest.raises(RoomError, match="expired"):
        rooms.claim(1)  # too late even before the reaper ran
    assert rooms.reap() == [(1, "pages-1")]
    assert freed == [(1, "pages-1")]
    assert 1 not in rooms and 2 in rooms
    with pytest.raises(RoomError, match="expired"):
        rooms.claim(1)  # a late decode learns why
    with pytest.raises(RoomError, match="unknown"):
        rooms.claim(3)
    clock.now += 100
    assert rooms.reap() == []  # a claimed room is the transfer's to end, never expired
    assert rooms.release(2) == "pages-2"
    assert rooms.release(2) is None
    assert len(rooms) == 0
    with pytest.raises(RoomError, match="unknown"):
        rooms.claim(1)  # the tombstone is bounded too


def test_bootstrap_timeout_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BOOTSTRAP_TIMEOUT_ENV, raising=False)
    assert bootstrap_timeout_s() == 300.0
    monkeypatch.setenv(BOOTSTRAP_TIMEOUT_ENV, "7.5")
    assert bootstrap_timeout_s() == 7.5
    assert RoomTable().timeout_s == 7.5
    monkeypatch.setenv(BOOTSTRAP_TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match=BOOTSTRAP_TIMEOUT_ENV):
        bootstrap_timeout_s()


def test_waiting_timeout_env_reads_like_the_bootstrap_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from radixserve.disaggregation.kv_receiver import WAITING_TIMEOUT_ENV, waiting_timeout_s

    monkeypatch.setenv(WAITING_TIMEOUT_ENV, " ")
    assert waiting_timeout_s() == 300.0
    monkeypatch.setenv(WAITING_TIMEOUT_ENV, "2")
    assert waiting_timeout_s() == 2.0
    for bad in ("0", "-1", "later"):
        monkeypatch.setenv(WAITING_TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=WAITING_TIMEOUT_ENV):
            waiting_timeout_s()


def test_server_reaps_rooms_without_traffic() -> None:
    freed: list[int] = []
    rooms: RoomTable[None] = RoomTable(timeout_s=0.2, on_expire=lambda r, _: freed.append(r))
    with BootstrapServer(host="127.0.0.1", port=0, rooms=rooms, reap_interval_s=0.05):
        rooms.open(42, None)
        rooms.open(43, None)
        rooms.claim(43)
        deadline = time.monotonic() + 10
        while not freed and time.monotonic() < deadline:
            time.sleep(0.05)
    assert freed == [42]
    assert 43 in rooms
