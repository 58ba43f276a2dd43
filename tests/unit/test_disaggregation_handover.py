"""The KV hand-over's state machine without engines: KVSender (prefill side) and KVReceiver
(decode side) over real ZMQ and a real bootstrap server, pages copied by LocalTransfer. A claim
may come before its room opens; every outcome releases the room exactly once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from radixserve.disaggregation.bootstrap import BootstrapServer, RoomTable, register_prefill_rank
from radixserve.disaggregation.kv_receiver import KVReceiver, LocalLayout
from radixserve.disaggregation.kv_sender import HeldKV, KVSender
from radixserve.disaggregation.transfer import LocalTransfer, TransferError

PAGE, SLOTS = 2, 32


class Side:
    def __init__(self, filled: bool) -> None:
        # Every slot of the prefill's buffers distinct; the decode's all zero.
        values = torch.arange(SLOTS * 8, dtype=torch.float32).reshape(SLOTS, 2, 4) + 1
        self.buffers = [values + 1000 * i if filled else torch.zeros_like(values) for i in range(4)]
        self.backend = LocalTransfer()
        self.backend.register_buffers(self.buffers, PAGE)


@pytest.fixture
def pair() -> Iterator[dict[str, Any]]:
    prefill, decode = Side(filled=True), Side(filled=False)
    released: list[int] = []
    rooms: RoomTable[HeldKV] = RoomTable(timeout_s=1.0)
    server = BootstrapServer(host="127.0.0.1", port=0, rooms=rooms, reap_interval_s=0.1).start()
    sender = KVSender(prefill.backend, rooms, released.append, "127.0.0.1", wait_timeout_s=1.0)
    url = f"http://127.0.0.1:{server.port}"
    register_prefill_rank(
        url,
        {
            "attn_tp_size": 1,
            "attn_tp_rank": 0,
            "rank_ip": "127.0.0.1",
            "rank_port": sender.port,
            "page_size": PAGE,
            "kv_cache_dtype": "float32",
        },
    )
    receiver = KVReceiver(decode.backend, LocalLayout(1, PAGE, "float32"), wait_timeout_s=5.0)
    try:
        yield {
            "prefill": prefill,
            "decode": decode,
            "rooms": rooms,
            "sender": sender,
            "receiver": receiver,
            "port": server.port,
            "released": released,
        }
    finally:
        receiver.close()
        sender.close()
        server.close()


def _claim(pair: dict[str, Any], room: int, pages: list[int], num_tokens: int) -> Any:
    return pair["receiver"].start("127.0.0.1", pair["port"], room, pages, num_tokens)


def test_claim_before_the_room_opens_then_pages_arrive(pair: dict[str, Any]) -> None:
    future = _claim(pair, 5, [7, 9], 4)
    time.sleep(0.2)  # the decode asked first; the prefill is still computing
    assert not future.done()
    pair["rooms"].open(5, HeldKV((1, 2), 4, {"token": 42, "logprob": -0.5}))
    reply = future.result(timeout=5)
    assert (reply["token"], reply["logprob"]) == (42, -0.5)
    for src, dst in zip(pair["prefill"].buffers, pair["decode"].buffers, strict=True):
        assert torch.equal(dst[14:16], src[2:4]) and torch.equal(dst[18:20], src[4:6])
        assert dst[:14].abs().sum() == 0 and dst[16:18].abs().sum() == 0  # nothing else
    assert pair["released"] == [5] and 5 not in pair["rooms"]


def test_failed_prefill_reaches_the_decode(pair: dict[str, Any]) -> None:
    future = _claim(pair, 6, [0], 2)
    pair["sender"].fail_room(6, "out of memory")
    with pytest.raises(TransferError, match="prefill server failed this request: out of memory"):
        future.result(timeout=5)
    assert pair["released"] == []  # it never held pages


def test_mismatched_prompt_is_refused_and_released(pair: dict[str, Any]) -> None:
    pair["rooms"].open(8, HeldKV((1, 2), 4, {"token": 1}))
    with pytest.raises(TransferError, match="expects 2 prompt tokens in 1 pages"):
        _claim(pair, 8, [3], 2).result(timeout=5)
    assert pair["released"] == [8]


def test_room_never_produced_times_out(pair: dict[str, Any]) -> None:
    with pytest.raises(TransferError, match="never produced room 11 within 1s"):
        _claim(pair, 11, [0], 2).result(timeout=5)


def test_unclaimed_room_expires_and_late_claim_is_told(pair: dict[str, Any]) -> None:
    expired: list[int] = []
    rooms = pair["rooms"]
    rooms._on_expire = lambda room, _: expired.append(room)
    rooms.open(12, HeldKV((1,), 2, {"token": 1}))
    deadline = time.monotonic() + 5
    while not expired and time.monotonic() < deadline:
        time.sleep(0.05)
    assert expired == [12]
    with pytest.raises(TransferError, match="bootstrap room 12 is expired"):
        _claim(pair, 12, [0], 2).result(timeout=5)


def test_layout_mismatch_is_refused(pair: dict[str, Any]) -> None:
    other = KVReceiver(pair["decode"].backend, LocalLayout(1, 4, "float32"), wait_timeout_s=2.0)
    try:
        with pytest.raises(TransferError, match="same --page-size"):
            other.start("127.0.0.1", pair["port"], 1, [0], 2).result(timeout=5)
        other2 = KVReceiver(pair["decode"].backend, LocalLayout(2, PAGE, "float32"))
        with pytest.raises(TransferError, match="different TP sizes"):
            other2.start("127.0.0.1", pair["port"], 1, [0], 2).result(timeout=5)
        other2.close()
    finally:
        other.close()
