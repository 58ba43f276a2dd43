"""The prefill side of a KV hand-over: answers decode servers' claims for rooms.

A decode server sends one control message per request over ZMQ (to the `rank_port` this prefill
rank registered with its bootstrap server): the room, its transfer session and buffers
(`PeerBuffers`), and the page ids it allocated for the prompt. This thread waits until the room
is open (the decode may ask before the prefill finished the prompt), writes the room's pages
into the decode's with the KVTransferBackend, and answers with the first token once the bytes
are there, or with an error. Either way the room ends and `on_release(room)` tells the
scheduler to free its pages (the scheduler owns the KV pool; this thread never touches it).

Control only: the KV data itself goes through the transfer backend, never over this socket.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from radixserve.disaggregation.bootstrap import RoomError, RoomTable
from radixserve.disaggregation.transfer import (
    KVTransferBackend,
    PeerBuffers,
    TransferError,
    TransferStatus,
)

logger = logging.getLogger(__name__)

POLL_MS = 2


@dataclass(frozen=True)
class HeldKV:
    """What a prefill holds for one room: its prompt's pages in order and the first token
    (`first`: token id and, when asked, its logprobs, as the decode side applies them)."""

    pages: tuple[int, ...]
    num_tokens: int
    first: dict[str, Any]


@dataclass
class TransferStats:
    """Totals for the metrics (sglang:kv_transfer_*)."""

    transfers: int = 0
    failed: int = 0
    bytes: int = 0
    latency_s: float = 0.0
    waiting_claims: int = 0
    in_flight: int = 0


@dataclass
class _Claim:
    identity: bytes
    room: int
    peer: PeerBuffers
    pages: list[int]
    num_tokens: int
    deadline: float


@dataclass
class _Active:
    claim: _Claim
    started: float
    nbytes: int
    payload: HeldKV = field(repr=False)


class KVSender:
    def __init__(
        self,
        backend: KVTransferBackend,
        rooms: RoomTable[HeldKV],
        on_release: Callable[[int], None],
        host: str,
        wait_timeout_s: float,
        port: int = 0,
    ) -> None:
        self.backend = backend
        self.rooms = rooms
        self.on_release = on_release
        self.wait_timeout_s = wait_timeout_s
        self.stats = TransferStats()
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        if port:
            self._sock.bind(f"tcp://{host}:{port}")
            self.port = port
        else:
            self.port = self._sock.bind_to_random_port(f"tcp://{host}")
        self._lock = threading.Lock()
        # room -> (why it failed, when to forget): a prefill that failed answers its decode.
        self._failed: dict[int, tuple[str, float]] = {}
        self._claims: list[_Claim] = []
        self._active: dict[int, _Active] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="pd-kv-sender")
        self._thread.start()

    def fail_room(self, room: int, message: str) -> None:
        """The prefill of `room` ended without KV (aborted, failed): its decode is told so."""
        with self._lock:
            self._failed[room] = (message, time.monotonic() + self.wait_timeout_s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close(linger=0)

    # -- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._sock.poll(POLL_MS):
                    self._receive()
                self._advance_claims()
                self._advance_transfers()
            except Exception:  # one bad message or transfer must not end KV serving
                logger.exception("KV sender")

    def _receive(self) -> None:
        while True:
            try:
                identity, raw = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                msg = json.loads(raw)
                claim = _Claim(
                    identity,
                    int(msg["room"]),
                    PeerBuffers.from_json(msg["peer"]),
                    [int(p) for p in msg["pages"]],
                    int(msg["num_tokens"]),
                    time.monotonic() + self.wait_timeout_s,
                )
            except (ValueError, KeyError, TypeError) as e:
                self._reply(identity, {"ok": False, "error": f"bad KV claim: {e}"})
                continue
            self._claims.append(claim)

    def _advance_claims(self) -> None:
        now = time.monotonic()
        waiting: list[_Claim] = []
        with self._lock:
            self._failed = {r: v for r, v in self._failed.items() if v[1] > now}
            failed = dict(self._failed)
        for claim in self._claims:
            state = self.rooms.state(claim.room)
            if state == "open":
                self._start(claim)
            elif claim.room in failed:
                self._error(
                    claim, f"the prefill server failed this request: {failed[claim.room][0]}"
                )
            elif state == "unknown" and now < claim.deadline:
                waiting.append(claim)  # the prefill has not finished this prompt yet
            elif state == "unknown":
                self._error(
                    claim,
                    f"the prefill server never produced room {claim.room} within "
                    f"{self.wait_timeout_s:g}s",
                )
            else:
                self._error(claim, f"bootstrap room {claim.room} is {state}")
        self._claims = waiting
        self.stats.waiting_claims = len(waiting)

    def _start(self, claim: _Claim) -> None:
        try:
            held = self.rooms.claim(claim.room)
        except RoomError as e:
            self._error(claim, str(e.args[0]))
            return
        try:
            if claim.num_tokens != held.num_tokens or len(claim.pages) != len(held.pages):
                raise TransferError(
                    f"the decode server expects {claim.num_tokens} prompt tokens in "
                    f"{len(claim.pages)} pages, the prefill holds {held.num_tokens} in "
                    f"{len(held.pages)} (different tokenization or page size)"
                )
            handle = self.backend.submit(
                claim.peer, list(zip(held.pages, claim.pages, strict=True))
            )
        except TransferError as e:
            self._release(claim.room)
            self._error(claim, str(e))
            return
        page_bytes = sum(b.page_bytes for b in self.backend.describe().buffers)
        self._active[handle] = _Active(claim, time.monotonic(), page_bytes * len(held.pages), held)
        self.stats.in_flight = len(self._active)

    def _advance_transfers(self) -> None:
        now = time.monotonic()
        for handle, active in list(self._active.items()):
            status = self.backend.poll(handle)
            if status is TransferStatus.PENDING and now - active.started < self.wait_timeout_s:
                continue
            del self._active[handle]
            claim = active.claim
            # Released before the answer: once the decode hears, the room is settled.
            self._release(claim.room)
            if status is TransferStatus.DONE:
                self.stats.transfers += 1
                self.stats.bytes += active.nbytes
                self.stats.latency_s += now - active.started
                self._reply(
                    claim.identity, {"ok": True, "room": claim.room, **active.payload.first}
                )
            else:
                # A decode that died mid-transfer lands here: its pages come back all the same.
                why = "failed" if status is TransferStatus.FAILED else "timed out"
                self._error(claim, f"KV transfer for room {claim.room} {why}")
        self.stats.in_flight = len(self._active)

    def _release(self, room: int) -> None:
        if self.rooms.release(room) is not None:
            self.on_release(room)

    def _error(self, claim: _Claim, message: str) -> None:
        self.stats.failed += 1
        logger.warning("KV claim for room %d: %s", claim.room, message)
        self._reply(claim.identity, {"ok": False, "room": claim.room, "error": message})

    def _reply(self, identity: bytes, body: dict[str, Any]) -> None:
        try:
            self._sock.send_multipart([identity, json.dumps(body).encode()], zmq.NOBLOCK)
        except zmq.ZMQError as e:  # the decode went away; nothing to tell it
            logger.info("KV sender: reply not delivered: %s", e)
