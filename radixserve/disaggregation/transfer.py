"""KV page transfer between a prefill server and a decode server (issue 30).

A backend registers the KV pool's buffers of its own process, describes them to the peer
(`describe()`: session id plus each buffer's address and page size, which the decode side sends
to the prefill side), and writes pages of its buffers into the peer's buffers: `submit()` takes
(src page, dst page) pairs and returns a handle that `poll()` / `wait()` resolve.

Two backends, as in SGLang's `--disaggregation-transfer-backend`:
- `MooncakeTransfer`: Mooncake's transfer engine (the `disaggregation` extra), TCP here, RDMA
  where there is an InfiniBand device. Peers find each other with P2PHANDSHAKE (no metadata
  server): the session id is "host:rpc_port".
- `FakeTransfer`: SGLang's `fake` backend: every transfer completes at once and moves nothing.
  SGLang's warm-up and health-check requests (bootstrap host 2.2.2.2) use it.

`LocalTransfer` copies inside one process (the in-process tests of the scheduler flow).
managers/disagg_setup.py builds the backend over the scheduler's KV pool.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

import torch

logger = logging.getLogger(__name__)

# SGLang's warm-up and health checks send this bootstrap host; they go to the fake backend.
FAKE_BOOTSTRAP_HOST = "2.2.2.2"

MOONCAKE_MISSING = (
    "--disaggregation-transfer-backend mooncake needs Mooncake's transfer engine: "
    "pip install 'radixserve[disaggregation]' (mooncake-transfer-engine-non-cuda on a machine "
    "without CUDA, mooncake-transfer-engine elsewhere); its engine links libibverbs.so.1 even "
    "for TCP (Debian/Ubuntu: apt-get install libibverbs1)"
)


# Requests per batch_transfer_sync_write call. 2048 passed and 4096 failed in one call on this
# machine (Mooncake 0.3.13, TCP); two worker threads of 1024 keep the lanes below that.
MAX_BATCH_REQUESTS = 1024


class TransferStatus(Enum):
    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True)
class BufferInfo:
    """One registered buffer: where it starts, its size, and the bytes of one KV page in it."""

    ptr: int
    length: int
    page_bytes: int

    @property
    def num_pages(self) -> int:
        return self.length // self.page_bytes


@dataclass(frozen=True)
class PeerBuffers:
    """What one side tells the other so that pages can be written into it: its transfer session
    and its buffers in registration order (same model, same layout on both sides)."""

    session_id: str
    buffers: tuple[BufferInfo, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "buffers": [[b.ptr, b.length, b.page_bytes] for b in self.buffers],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PeerBuffers:
        return cls(
            session_id=str(data["session_id"]),
            buffers=tuple(BufferInfo(int(p), int(n), int(b)) for p, n, b in data["buffers"]),
        )


class TransferError(RuntimeError):
    pass


def buffer_info(tensor: torch.Tensor, page_size: int) -> BufferInfo:
    """A KV buffer laid out [slot, ...] (radixserve's KVCache: [slot, head, dim]) seen as pages
    of `page_size` consecutive slots. It must be contiguous: a page is one byte range."""
    if not tensor.is_contiguous():
        raise TransferError("KV buffers must be contiguous to be registered for transfer")
    if page_size < 1:
        raise TransferError(f"page_size must be >= 1, got {page_size}")
    row_bytes = tensor.stride(0) * tensor.element_size() if tensor.dim() else 0
    return BufferInfo(
        ptr=tensor.data_ptr(),
        length=tensor.numel() * tensor.element_size(),
        page_bytes=row_bytes * page_size,
    )


def coalesce_pages(pages: Sequence[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(src, dst) page pairs as (src, dst, count) runs where both sides are consecutive: one
    transfer request per run instead of per page (a prompt's pages are mostly allocated in
    order on both sides, so a long prompt becomes a few large writes)."""
    runs: list[tuple[int, int, int]] = []
    for src, dst in pages:
        if runs:
            s, d, n = runs[-1]
            if src == s + n and dst == d + n:
                runs[-1] = (s, d, n + 1)
                continue
        runs.append((src, dst, 1))
    return runs


def _check_compatible(local: Sequence[BufferInfo], peer: PeerBuffers) -> None:
    # Different page sizes, KV dtypes or TP layouts show up as different buffer counts or page
    # byte sizes: refuse them here rather than write garbage into the peer's cache.
    if len(local) != len(peer.buffers):
        raise TransferError(
            f"peer {peer.session_id} registered {len(peer.buffers)} KV buffers, this side "
            f"{len(local)}: the two servers must run the same model with the same layout"
        )
    for i, (ours, theirs) in enumerate(zip(local, peer.buffers, strict=True)):
        if ours.page_bytes != theirs.page_bytes:
            raise TransferError(
                f"KV buffer {i}: a page is {ours.page_bytes} bytes here and "
                f"{theirs.page_bytes} bytes on peer {peer.session_id} (different page size, "
                "KV dtype or heads per rank are not supported)"
            )


def _check_range(
    local: Sequence[BufferInfo], peer: PeerBuffers, runs: Sequence[tuple[int, int, int]]
) -> None:
    for src, dst, n in runs:
        if src < 0 or dst < 0:
            raise TransferError(f"negative page index in run ({src}, {dst}, {n})")
        for ours, theirs in zip(local, peer.buffers, strict=True):
            if src + n > ours.num_pages or dst + n > theirs.num_pages:
                raise TransferError(
                    f"pages ({src}..{src + n}) -> ({dst}..{dst + n}) out of range: "
                    f"{ours.num_pages} pages here, {theirs.num_pages} on the peer"
                )


class KVTransferBackend(ABC):
    """Moves KV pages from this process's registered buffers into a peer's."""

    def __init__(self) -> None:
        self._buffers: list[BufferInfo] = []
        self._tensors: list[torch.Tensor] = []
        self._ids = itertools.count(1)

    @property
    @abstractmethod
    def session_id(self) -> str:
        """How a peer addresses this side."""

    def register_buffers(self, tensors: Sequence[torch.Tensor], page_size: int) -> None:
        """Registers a KV pool's buffers (every layer's K, then V, in a fixed order that both
        sides share). Call once, before any transfer."""
        kept = [t for t in tensors if t.numel()]
        infos = [buffer_info(t, page_size) for t in kept]
        self._register(infos)
        self._buffers.extend(infos)
        # The engine reads and writes these addresses from its own threads: holding the tensors
        # here keeps a caller's dropped pool from turning transfers into use-after-free
        # ("Bad address" from Mooncake's TCP writer, or silent corruption on the peer).
        self._tensors.extend(kept)

    def describe(self) -> PeerBuffers:
        return PeerBuffers(self.session_id, tuple(self._buffers))

    def submit(self, peer: PeerBuffers, pages: Sequence[tuple[int, int]]) -> int:
        """Starts writing each local page `src` into the peer's page `dst`, in every buffer.
        Returns a handle for `poll` / `wait`. Bad input raises at once."""
        _check_compatible(self._buffers, peer)
        runs = coalesce_pages(pages)
        _check_range(self._buffers, peer, runs)
        handle = next(self._ids)
        self._start(handle, peer, runs)
        return handle

    @abstractmethod
    def poll(self, handle: int) -> TransferStatus:
        """The transfer's state. DONE or FAILED is final: the backend may forget the handle
        once it has reported one of them."""

    def wait(self, handle: int, timeout_s: float | None = None) -> TransferStatus:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            status = self.poll(handle)
            if status is not TransferStatus.PENDING:
                return status
            if deadline is not None and time.monotonic() >= deadline:
                return status
            time.sleep(0.001)

    def close(self) -> None:
        """Releases what the backend holds (threads, registrations, the buffers' references)."""
        self._buffers.clear()
        self._tensors.clear()

    @abstractmethod
    def _register(self, infos: Sequence[BufferInfo]) -> None: ...

    @abstractmethod
    def _start(
        self, handle: int, peer: PeerBuffers, runs: Sequence[tuple[int, int, int]]
    ) -> None: ...


class FakeTransfer(KVTransferBackend):
    """SGLang's `fake` backend: registers nothing and moves nothing; every transfer is DONE at
    once. For warm-up and health-check requests, which must not touch a real peer."""

    @property
    def session_id(self) -> str:
        return "fake"

    def submit(self, peer: PeerBuffers, pages: Sequence[tuple[int, int]]) -> int:
        # No layout checks: the "peer" of a warm-up request describes nothing.
        return next(self._ids)

    def poll(self, handle: int) -> TransferStatus:
        return TransferStatus.DONE

    def _register(self, infos: Sequence[BufferInfo]) -> None:
        pass

    def _start(self, handle: int, peer: PeerBuffers, runs: Sequence[tuple[int, int, int]]) -> None:
        pass


class LocalTransfer(KVTransferBackend):
    """Both sides in one process (tests, and a prefill and decode scheduler sharing a process):
    pages are copied with memmove between the registered addresses. It checks what the real
    backends check (layout, ranges), so the scheduler flow can be tested without Mooncake."""

    def __init__(self) -> None:
        super().__init__()
        self._session = f"local-{id(self):x}"
        self._done: dict[int, TransferStatus] = {}

    @property
    def session_id(self) -> str:
        return self._session

    def _register(self, infos: Sequence[BufferInfo]) -> None:
        pass

    def _start(self, handle: int, peer: PeerBuffers, runs: Sequence[tuple[int, int, int]]) -> None:
        for ours, theirs in zip(self._buffers, peer.buffers, strict=True):
            for src, dst, n in runs:
                ctypes.memmove(
                    theirs.ptr + dst * theirs.page_bytes,
                    ours.ptr + src * ours.page_bytes,
                    n * ours.page_bytes,
                )
        self._done[handle] = TransferStatus.DONE

    def poll(self, handle: int) -> TransferStatus:
        return self._done.pop(handle, TransferStatus.FAILED)


def mooncake_protocol(backend: str, ib_device: str | None) -> Literal["tcp", "rdma"]:
    """`mooncake_tcp` is always TCP; `mooncake` uses RDMA when an InfiniBand device is named
    (--disaggregation-ib-device) and TCP otherwise, so one machine without RDMA works."""
    if backend == "mooncake_tcp" or not ib_device:
        return "tcp"
    return "rdma"


def import_mooncake_engine() -> Any:
    """mooncake.engine.TransferEngine, or a TransferError that says which extra to install.
    Imported lazily: the package is optional and its import loads native libraries."""
    try:
        from mooncake.engine import TransferEngine
    except ImportError as e:
        raise TransferError(f"{MOONCAKE_MISSING} ({e})") from e
    return TransferEngine


class MooncakeTransfer(KVTransferBackend):
    """Mooncake's transfer engine with P2PHANDSHAKE. Writes run on a small thread pool
    (`batch_transfer_sync_write` blocks, and the engine releases the GIL while it does), so
    the scheduler can `poll` without waiting for bytes on the wire."""

    def __init__(
        self,
        hostname: str,
        protocol: Literal["tcp", "rdma"] = "tcp",
        ib_device: str | None = None,
        max_workers: int = 2,
        max_batch_requests: int = MAX_BATCH_REQUESTS,
    ) -> None:
        super().__init__()
        self._max_batch = max_batch_requests
        engine_cls = import_mooncake_engine()
        self._engine = engine_cls()
        ret = self._engine.initialize(hostname, "P2PHANDSHAKE", protocol, ib_device or "")
        if ret != 0:
            raise TransferError(
                f"Mooncake TransferEngine.initialize({hostname!r}, P2PHANDSHAKE, {protocol}) "
                f"returned {ret}"
            )
        self._session_id = f"{hostname}:{self._engine.get_rpc_port()}"
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="kv-xfer")
        self._lock = threading.Lock()
        self._futures: dict[int, Future[int]] = {}
        self._closed = False

    @property
    def session_id(self) -> str:
        return self._session_id

    def _register(self, infos: Sequence[BufferInfo]) -> None:
        for info in infos:
            ret = self._engine.register_memory(info.ptr, info.length)
            if ret != 0:
                raise TransferError(f"Mooncake register_memory({info.length} bytes) returned {ret}")

    def _start(self, handle: int, peer: PeerBuffers, runs: Sequence[tuple[int, int, int]]) -> None:
        src_addrs: list[int] = []
        dst_addrs: list[int] = []
        lengths: list[int] = []
        for ours, theirs in zip(self._buffers, peer.buffers, strict=True):
            for src, dst, n in runs:
                src_addrs.append(ours.ptr + src * ours.page_bytes)
                dst_addrs.append(theirs.ptr + dst * theirs.page_bytes)
                lengths.append(n * ours.page_bytes)
        future = self._pool.submit(self._write, peer.session_id, src_addrs, dst_addrs, lengths)
        with self._lock:
            self._futures[handle] = future

    def _write(self, session: str, src: list[int], dst: list[int], lengths: list[int]) -> int:
        # In batches: Mooncake's TCP transport rejects a batch larger than its lane queue
        # ("TCP lane queue-full rejection", seen from about 4096 requests with 0.3.13), and
        # scattered decode pages times 2 x layers buffers reach that with one long prompt.
        for i in range(0, len(lengths), self._max_batch):
            j = i + self._max_batch
            ret = int(
                self._engine.batch_transfer_sync_write(session, src[i:j], dst[i:j], lengths[i:j])
            )
            if ret < 0:
                return ret
        return 0

    def poll(self, handle: int) -> TransferStatus:
        with self._lock:
            future = self._futures.get(handle)
        if future is None:
            raise TransferError(f"unknown or already completed transfer handle {handle}")
        if not future.done():
            return TransferStatus.PENDING
        with self._lock:
            del self._futures[handle]
        try:
            ret = future.result()
        except Exception:
            logger.exception("KV transfer %d raised", handle)
            return TransferStatus.FAILED
        if ret < 0:
            logger.warning("KV transfer %d failed: Mooncake returned %d", handle, ret)
            return TransferStatus.FAILED
        return TransferStatus.DONE

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True)
        for info in self._buffers:
            self._engine.unregister_memory(info.ptr)
        super().close()
