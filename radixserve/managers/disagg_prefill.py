"""--disaggregation-mode prefill: the scheduler's side of holding KV for decode servers.

A request that carries a bootstrap room runs its prompt here (radix cache and all) and stops
after the first token (SGLang's prefill server answers the router with that short response).
Instead of giving its KV back, the finished request is *held*: its pages and first token go
into the room table, and the request's pages stay allocated until the KV sender (another
thread) reports the room released: transferred, failed, or expired because no decode claimed
it. Only the scheduler thread touches the KV pool; the sender just queues room ids.
"""

from __future__ import annotations

import logging
import queue
import time
from typing import TYPE_CHECKING, Any

from radixserve.disaggregation.bootstrap import (
    BootstrapServer,
    RoomError,
    RoomTable,
    register_prefill_rank,
)
from radixserve.disaggregation.kv_sender import HeldKV, KVSender
from radixserve.disaggregation.transfer import FAKE_BOOTSTRAP_HOST, KVTransferBackend
from radixserve.messages import FinishReason

if TYPE_CHECKING:
    from radixserve.managers.schedule_batch import Req
    from radixserve.managers.scheduler import Scheduler

logger = logging.getLogger(__name__)


def is_pd_request(req: Req) -> bool:
    """A request with a real room (SGLang's warm-up and health checks use host 2.2.2.2 and run
    as plain requests)."""
    return req.bootstrap is not None and req.bootstrap.host != FAKE_BOOTSTRAP_HOST


# A failed step waits this long for KV writes in flight before the pool is reset.
DRAIN_TIMEOUT_S = 30.0
DRAIN_POLL_S = 0.01


class DisaggPrefill:
    role = "prefill"

    def __init__(
        self,
        scheduler: Scheduler,
        backend: KVTransferBackend,
        advertise_host: str,
        bootstrap_port: int,
        kv_dtype: str,
    ) -> None:
        self.sched = scheduler
        self.backend = backend
        self._released: queue.SimpleQueue[int] = queue.SimpleQueue()
        self.rooms: RoomTable[HeldKV] = RoomTable(
            on_expire=lambda room, _: self._released.put(room)
        )
        self.held: dict[int, Req] = {}
        try:
            self.server = BootstrapServer(host="0.0.0.0", port=bootstrap_port, rooms=self.rooms)
        except OSError as e:
            raise RuntimeError(
                f"--disaggregation-bootstrap-port {bootstrap_port}: cannot listen there ({e}); "
                "pick a free port"
            ) from e
        self.server.start()
        # A claim waits for its room (the decode may ask first) as long as a room waits for
        # its claim.
        self.sender = KVSender(
            backend, self.rooms, self._released.put, "0.0.0.0", self.rooms.timeout_s
        )
        register_prefill_rank(
            f"http://127.0.0.1:{self.server.port}",
            {
                "attn_tp_size": 1,
                "attn_tp_rank": 0,
                "rank_ip": advertise_host,
                "rank_port": self.sender.port,
                "page_size": scheduler.page_size,
                "kv_cache_dtype": kv_dtype,
            },
        )
        logger.info(
            "PD prefill: bootstrap server on port %d, KV sender at %s:%d (%s)",
            self.server.port,
            advertise_host,
            self.sender.port,
            type(backend).__name__,
        )

    def prepare(self, req: Req) -> None:
        """A PD request computes its prompt and first token only; the decode server does the
        rest."""
        if is_pd_request(req) and (req.sampling_params.max_new_tokens or 0) > 1:
            req.sampling_params.max_new_tokens = 1

    def hold(self, req: Req, reason: FinishReason) -> bool:
        """Called as a request finishes, before its KV is released: True if the room now holds
        it (the scheduler then must not release it)."""
        if not is_pd_request(req):
            return False
        room = req.bootstrap.room
        if reason.type == "abort" or req.req_pool_idx is None or not req.output_ids:
            self.sender.fail_room(room, reason.message or "the prefill request was aborted")
            return False
        n = len(req.origin_input_ids)
        ps = self.sched.page_size
        slots = self.sched.kv.req_to_token_pool.read(req.req_pool_idx, 0, n)
        pages = tuple(int(s) // ps for s in slots[::ps].tolist())
        first: dict[str, Any] = {"token": req.output_ids[0]}
        if req.output_token_logprobs:
            first["logprob"] = req.output_token_logprobs[0][0]
        if req.output_top_logprobs:
            first["top_logprobs"] = [list(e) for e in req.output_top_logprobs[0]]
        if req.output_token_ids_logprobs:
            first["ids_logprobs"] = [list(e) for e in req.output_token_ids_logprobs[0]]
        try:
            self.rooms.open(room, HeldKV(pages, n, first))
        except RoomError as e:
            logger.warning("PD prefill %s: %s; its KV is not held", req.rid, e.args[0])
            return False
        self.held[room] = req
        return True

    def poll(self) -> None:
        """Free the pages of every room the sender released (or that expired)."""
        while True:
            try:
                room = self._released.get_nowait()
            except queue.Empty:
                return
            req = self.held.pop(room, None)
            if req is not None:
                self.sched.kv.release(req)

    def busy(self) -> bool:
        return bool(self.held) or not self._released.empty()

    def held_reqs(self) -> list[Req]:
        return list(self.held.values())

    def live_reqs(self) -> list[Req]:
        return []

    def abort(self, rid: str | None, abort_all: bool) -> None:
        """Held requests have answered their client already; an abort changes nothing."""

    def before_hard_reset(self, timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        """A failed step is about to wipe the pool: close every room (a decode that claims one
        is told it is unknown) and wait for the writes in flight, which read pages the next
        requests would be given."""
        for room in list(self.held):
            self.rooms.release(room)
        deadline = time.monotonic() + timeout_s
        while self.sender.stats.in_flight and time.monotonic() < deadline:
            time.sleep(DRAIN_POLL_S)
        if self.sender.stats.in_flight:
            logger.warning(
                "%d KV transfer(s) still reading pages after %.0f s; resetting the pool anyway",
                self.sender.stats.in_flight,
                timeout_s,
            )

    def after_hard_reset(self, message: str) -> None:
        self.held.clear()

    def info(self) -> dict[str, Any]:
        stats = self.sender.stats
        return {
            "disaggregation_mode": self.role,
            "kv_transfer_total": stats.transfers,
            "kv_transfer_failed_total": stats.failed,
            "kv_transfer_bytes_total": stats.bytes,
            "kv_transfer_latency_seconds_total": stats.latency_s,
            "num_prefill_inflight_queue_reqs": len(self.held),
            "num_prefill_bootstrap_queue_reqs": stats.waiting_claims,
        }

    def close(self) -> None:
        self.sender.close()
        self.server.close()
        self.backend.close()
