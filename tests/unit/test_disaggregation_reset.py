"""A failed step resets the KV pool; before it does, each PD role lets the transfers in flight
end: a prefill's writes read pages and a decode's prefill writes into pages that the next
requests would be given. Roles built without their servers (their state only)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

from radixserve.disaggregation.bootstrap import RoomTable
from radixserve.disaggregation.kv_sender import TransferStats
from radixserve.managers.disagg_decode import DisaggDecode, _Transfer
from radixserve.managers.disagg_prefill import DisaggPrefill

DELAY_S = 0.3


def _later(action: Any) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(DELAY_S), action()))
    thread.start()
    return thread


def test_decode_waits_for_its_transfers_before_the_reset() -> None:
    decode = DisaggDecode(None, None, SimpleNamespace(wait_timeout_s=10.0))  # type: ignore[arg-type]
    future: Future[dict[str, Any]] = Future()
    req = SimpleNamespace(rid="r1", finished=False)
    decode.transfers["r1"] = _Transfer(req, future, 4, time.monotonic())  # type: ignore[arg-type]
    writer = _later(lambda: future.set_result({"token": 1}))
    start = time.monotonic()
    decode.before_hard_reset()
    assert future.done() and time.monotonic() - start >= DELAY_S * 0.9
    writer.join()


def test_decode_reset_survives_a_failed_transfer() -> None:
    decode = DisaggDecode(None, None, SimpleNamespace(wait_timeout_s=10.0))  # type: ignore[arg-type]
    future: Future[dict[str, Any]] = Future()
    future.set_exception(RuntimeError("the prefill went away"))
    decode.transfers["r1"] = _Transfer(SimpleNamespace(), future, 4, 0.0)  # type: ignore[arg-type]
    decode.before_hard_reset()  # no raise


def test_prefill_closes_its_rooms_and_waits_for_reads_in_flight() -> None:
    prefill = DisaggPrefill.__new__(DisaggPrefill)  # no servers: the state only
    prefill.rooms = RoomTable()
    prefill.rooms.open(7, "pages")
    prefill.held = {7: SimpleNamespace()}
    stats = TransferStats(in_flight=1)
    prefill.sender = SimpleNamespace(stats=stats)

    def done() -> None:
        stats.in_flight = 0

    reader = _later(done)
    start = time.monotonic()
    prefill.before_hard_reset(timeout_s=10.0)
    assert stats.in_flight == 0 and time.monotonic() - start >= DELAY_S * 0.9
    assert 7 not in prefill.rooms  # a late claim is told the room is unknown
    reader.join()
    prefill.after_hard_reset("boom")
    assert prefill.held == {}


def test_prefill_reset_goes_on_after_its_timeout() -> None:
    prefill = DisaggPrefill.__new__(DisaggPrefill)
    prefill.rooms = RoomTable()
    prefill.held = {}
    prefill.sender = SimpleNamespace(stats=TransferStats(in_flight=1))
    start = time.monotonic()
    prefill.before_hard_reset(timeout_s=0.2)
    assert 0.15 < time.monotonic() - start < 5
