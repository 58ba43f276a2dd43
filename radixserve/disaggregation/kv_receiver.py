"""The decode side of a KV hand-over: claims a request's room from its prefill server.

For each request a worker thread asks the prefill's bootstrap server where its rank listens
(once per server, checking that both sides lay out KV the same way), sends the claim over ZMQ
(room, this side's transfer session and buffers, the pages allocated for the prompt) and waits
for the answer: the first token once the prefill wrote the pages, or an error. The wait ends
early when the prefill's bootstrap server stops answering (a prefill that died), and at the
latest after SGLANG_DISAGGREGATION_WAITING_TIMEOUT seconds.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import zmq

from radixserve.disaggregation.bootstrap import (
    PrefillRankInfo,
    fetch_prefill_rank,
    fetch_prefill_server_info,
    seconds_from_env,
)
from radixserve.disaggregation.transfer import KVTransferBackend, TransferError

logger = logging.getLogger(__name__)

WAITING_TIMEOUT_ENV = "SGLANG_DISAGGREGATION_WAITING_TIMEOUT"
DEFAULT_WAITING_TIMEOUT_S = 300.0
# Consecutive failed health checks of the prefill's bootstrap server before giving up.
HEALTH_FAILURES = 3
HEALTH_INTERVAL_S = 1.0
HEALTH_TIMEOUT_S = 1.0


def waiting_timeout_s() -> float:
    """Seconds a decode request waits for its KV (SGLang's variable and default)."""
    return seconds_from_env(WAITING_TIMEOUT_ENV, DEFAULT_WAITING_TIMEOUT_S)


@dataclass(frozen=True)
class LocalLayout:
    """This decode server's KV layout, which the prefill's must match."""

    tp_size: int
    page_size: int
    kv_cache_dtype: str


class KVReceiver:
    def __init__(
        self,
        backend: KVTransferBackend,
        layout: LocalLayout,
        wait_timeout_s: float | None = None,
        max_workers: int = 64,
    ) -> None:
        self.backend = backend
        self.layout = layout
        self.wait_timeout_s = waiting_timeout_s() if wait_timeout_s is None else wait_timeout_s
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="pd-kv-recv")
        self._ranks: dict[str, PrefillRankInfo] = {}
        self._lock = threading.Lock()
        self._ctx = zmq.Context.instance()

    def start(
        self, host: str, port: int, room: int, pages: list[int], num_tokens: int
    ) -> Future[dict[str, Any]]:
        """Claims `room`; the future gives the prefill's answer ({"token", "logprob", ...}) or
        raises TransferError with a message for the client."""
        return self._pool.submit(self._fetch, host, port, room, pages, num_tokens)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _fetch(
        self, host: str, port: int, room: int, pages: list[int], num_tokens: int
    ) -> dict[str, Any]:
        url = f"http://{host}:{port}"
        deadline = time.monotonic() + self.wait_timeout_s
        rank = self._rank(url, deadline)
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(f"tcp://{rank.rank_ip}:{rank.rank_port}")
            claim = {
                "room": room,
                "peer": self.backend.describe().to_json(),
                "pages": pages,
                "num_tokens": num_tokens,
            }
            sock.send(json.dumps(claim).encode())
            failures, next_check = 0, time.monotonic() + HEALTH_INTERVAL_S
            while time.monotonic() < deadline:
                if sock.poll(100):
                    reply = json.loads(sock.recv())
                    if not reply.get("ok"):
                        raise TransferError(str(reply.get("error", "KV transfer failed")))
                    return reply
                if time.monotonic() >= next_check:
                    failures = 0 if _healthy(url) else failures + 1
                    if failures >= HEALTH_FAILURES:
                        raise TransferError(f"the prefill server {url} stopped answering")
                    next_check = time.monotonic() + HEALTH_INTERVAL_S
            raise TransferError(
                f"no KV from the prefill server {url} for room {room} within "
                f"{self.wait_timeout_s:g}s ({WAITING_TIMEOUT_ENV})"
            )
        finally:
            sock.close(linger=0)

    def _rank(self, url: str, deadline: float) -> PrefillRankInfo:
        with self._lock:
            known = self._ranks.get(url)
        if known is not None:
            return known
        failures = 0
        while True:
            try:
                info = fetch_prefill_server_info(url)
                failures = 0
            except httpx.HTTPError as e:
                failures += 1
                if failures >= HEALTH_FAILURES:
                    raise TransferError(
                        f"the prefill bootstrap server {url} is unreachable: {e}"
                    ) from e
                info = None
            if info is not None:
                break
            if time.monotonic() >= deadline:
                raise TransferError(f"the prefill bootstrap server {url} never became ready")
            time.sleep(0.2)
        self._check_layout(url, info.attn_tp_size, info.page_size, info.kv_cache_dtype)
        rank = fetch_prefill_rank(url, 0, 0, 0, 0)
        if rank is None:
            raise TransferError(f"the prefill bootstrap server {url} has no rank 0")
        with self._lock:
            self._ranks[url] = rank
        return rank

    def _check_layout(self, url: str, tp: int, page: int | None, dtype: str | None) -> None:
        ours = self.layout
        if tp != ours.tp_size:
            raise TransferError(
                f"the prefill server {url} runs --tp-size {tp}, this decode server "
                f"{ours.tp_size}: different TP sizes on the two sides are not supported"
            )
        if page is not None and page != ours.page_size:
            raise TransferError(
                f"the prefill server {url} runs --page-size {page}, this decode server "
                f"{ours.page_size}: start both with the same --page-size"
            )
        if dtype is not None and dtype != ours.kv_cache_dtype:
            raise TransferError(
                f"the prefill server {url} stores KV as {dtype}, this decode server as "
                f"{ours.kv_cache_dtype}: start both with the same --kv-cache-dtype"
            )


def _healthy(url: str) -> bool:
    """False when the prefill's bootstrap server is gone (refused, reset, an error status).
    A server that took the connection but is slow to answer counts as alive: a prefill busy
    with long prompts on a loaded machine can take seconds (measured with benchmarks/pd_mix.py),
    and a hung one still ends at the waiting timeout."""
    try:
        return httpx.get(f"{url}/health", timeout=HEALTH_TIMEOUT_S).status_code == 200
    except httpx.ReadTimeout:
        return True
    except httpx.HTTPError:
        return False
