"""--disaggregation-mode decode: the scheduler's side of receiving KV from prefill servers.

A request with a bootstrap room does not prefill here. It leaves the waiting queue for this
manager, which gives it a table row and slots for its whole prompt, and asks its prefill server
(through the KVReceiver, on worker threads) to write the prompt's KV into those slots. When the
prefill answers, the request has its prompt's KV and its first token: it joins the running
batch and decodes from there. On any failure it ends once, with the error, and its slots are
freed without entering the prefix cache (they hold no valid KV). An abort while the transfer
runs answers the client at once but keeps the slots until the transfer ends (the prefill may
still be writing into them).
"""

from __future__ import annotations

import contextlib
import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from radixserve.disaggregation.kv_receiver import KVReceiver
from radixserve.disaggregation.transfer import KVTransferBackend
from radixserve.managers.disagg_prefill import is_pd_request
from radixserve.mem_cache.namespace import namespaced_key
from radixserve.messages import FinishReason
from radixserve.sampling.token_result import TokenResult

if TYPE_CHECKING:
    from radixserve.managers.schedule_batch import Req
    from radixserve.managers.scheduler import Scheduler

logger = logging.getLogger(__name__)


@dataclass
class _Transfer:
    req: Req
    future: Future[dict[str, Any]]
    num_tokens: int
    started: float


class DisaggDecode:
    role = "decode"

    def __init__(self, scheduler: Scheduler, backend: KVTransferBackend, receiver: KVReceiver):
        self.sched = scheduler
        self.backend = backend
        self.receiver = receiver
        self.queued: list[Req] = []  # waiting for a row and slots
        self.transfers: dict[str, _Transfer] = {}
        self.received = 0
        self.failed = 0
        self.latency_s = 0.0

    def prepare(self, req: Req) -> None:
        pass

    def hold(self, req: Req, reason: FinishReason) -> bool:
        return False

    def busy(self) -> bool:
        return bool(self.queued or self.transfers)

    def held_reqs(self) -> list[Req]:
        """Requests owning slots outside the scheduler's queues (for the KV checks)."""
        return [t.req for t in self.transfers.values()]

    def live_reqs(self) -> list[Req]:
        """Requests the client still waits for (for aborts and time limits)."""
        return [*self.queued, *(t.req for t in self.transfers.values() if not t.req.finished)]

    def poll(self) -> None:
        self._take_new()
        self._start_queued()
        self._finish_transfers()

    def _take_new(self) -> None:
        sched = self.sched
        queues = sched.queues
        mine = [r for r in queues.waiting if is_pd_request(r) and not r.kv_received]
        if not mine:
            return
        ids = {id(r) for r in mine}
        queues.waiting = [r for r in queues.waiting if id(r) not in ids]
        self.queued.extend(mine)

    def _start_queued(self) -> None:
        sched = self.sched
        kv = sched.kv
        while self.queued:
            if len(sched.queues.running) + len(self.transfers) >= sched.max_running_requests:
                return
            req = self.queued[0]
            n = len(req.origin_input_ids)
            # No prefix match: the prompt's KV all comes from the prefill.
            match = kv.prefix_cache.match_prefix(
                namespaced_key([], req.lora_id), update_stats=False
            )
            if not kv.admit(req, match.indices[:0], match.last_node):
                return
            slots = kv.alloc_extend(req, n)
            if slots is None:
                kv.release(req)  # nothing computed yet: gives the row back
                return
            self.queued.pop(0)
            # The slots count as the request's from now (KV conservation checks); they are
            # never cached before the KV arrived: a failure discards them.
            req.kv_len = n
            ps = sched.page_size
            pages = [int(s) // ps for s in slots[::ps].tolist()]
            boot = req.bootstrap
            if req.first_scheduled_time is None:
                req.first_scheduled_time = time.monotonic()
            future = self.receiver.start(boot.host, boot.port, boot.room, pages, n)
            self.transfers[req.rid] = _Transfer(req, future, n, time.monotonic())

    def _finish_transfers(self) -> None:
        sched = self.sched
        for rid, t in list(self.transfers.items()):
            if not t.future.done():
                continue
            del self.transfers[rid]
            req = t.req
            try:
                first = t.future.result()
            except Exception as e:
                self.failed += 1
                sched.kv.discard(req, t.num_tokens)
                if not req.finished:
                    logger.warning("PD decode %s: %s", req.rid, e)
                    sched.outputs.finish(
                        req, FinishReason("abort", message=str(e), status_code=500)
                    )
                continue
            self.received += 1
            self.latency_s += time.monotonic() - t.started
            if req.finished:  # aborted while the KV came
                sched.kv.discard(req, t.num_tokens)
                continue
            req.kv_received = True
            if not req.admitted_once:
                req.admitted_once = True
                sched.stats.prompt_tokens += t.num_tokens
            self._apply_first(req, first)

    def _apply_first(self, req: Req, first: dict[str, Any]) -> None:
        sched = self.sched
        token = int(first["token"])
        result = TokenResult(
            token,
            float(first.get("logprob") or 0.0),
            [tuple(e) for e in first.get("top_logprobs") or []],
            [tuple(e) for e in first.get("ids_logprobs") or []],
        )
        if sched.outputs.apply_token(req, result):
            sched.queues.running.append(req)

    def abort(self, rid: str | None, abort_all: bool) -> None:
        sched = self.sched
        for req in list(self.queued):
            if abort_all or req.rid == rid:
                self.queued.remove(req)
                sched.outputs.finish(req, FinishReason("abort", message="Aborted by the client."))
        for t in self.transfers.values():
            if (abort_all or t.req.rid == rid) and not t.req.finished:
                # Answer now; the slots wait for the transfer to end (_finish_transfers).
                sched.outputs.end_unrun(
                    t.req, FinishReason("abort", message="Aborted by the client.")
                )

    def before_hard_reset(self) -> None:
        """A failed step is about to wipe the pool: wait for the transfers in flight, whose
        prefill servers write into pages the next requests would be given. Each ends by the
        receiver's waiting timeout at the latest."""
        for t in self.transfers.values():
            with contextlib.suppress(Exception):
                t.future.result(timeout=self.receiver.wait_timeout_s)

    def after_hard_reset(self, message: str) -> None:
        """A failed step wiped the pool (its transfers ended first, before_hard_reset): every
        request here ends with the error."""
        sched = self.sched
        for req in self.live_reqs():
            req.req_pool_idx = None
            sched.outputs.end_unrun(req, FinishReason("abort", message=message, status_code=500))
        self.transfers.clear()
        self.queued.clear()

    def info(self) -> dict[str, Any]:
        return {
            "disaggregation_mode": self.role,
            "kv_transfer_total": self.received,
            "kv_transfer_failed_total": self.failed,
            "kv_transfer_latency_seconds_total": self.latency_s,
            "num_decode_prealloc_queue_reqs": len(self.queued),
            "num_decode_transfer_queue_reqs": len(self.transfers),
        }

    def close(self) -> None:
        self.receiver.close()
        self.backend.close()
