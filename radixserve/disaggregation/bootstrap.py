"""The prefill server's bootstrap server and its room table (issue 30).

SGLang's prefill server listens on `--disaggregation-bootstrap-port` (8998) with three routes,
kept here with SGLang's names and fields so a decode side written against SGLang's finds what
it expects:

- `PUT /route`: each prefill rank registers where it serves KV (`rank_ip`, `rank_port`) with
  its place in the parallel layout (`attn_tp_rank`/`attn_tp_size`, `attn_cp_*`, `attn_dp_*`,
  `pp_*`, `system_dp_*`) and the cache format (`page_size`, `kv_cache_dtype`). Answers "OK".
- `GET /route?prefill_dp_rank=&prefill_cp_rank=&target_tp_rank=&target_pp_rank=`: the decode
  side looks up one rank's `{"rank_ip", "rank_port"}`; all four -1 asks for the prefill
  server's layout (`attn_tp_size`, `attn_cp_size`, `dp_size`, `pp_size`, `page_size`,
  `kv_cache_dtype`, `follow_bootstrap_room`). 400 when a parameter is missing, 503 until every
  rank of the layout has registered, 404 for a rank nobody registered.
- `GET /health`: "OK".

A room (`bootstrap_room`, the random id SGLang's router adds to both halves of a request) is
the prefill's KV for one request, waiting for its decode server. `RoomTable` holds them and
expires rooms no decode claimed within SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT seconds (SGLang's
variable, same default of 300), handing each expired room to a callback that frees its pages.

A prefill server (managers/disagg_prefill.py) starts this in its scheduler process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from typing import Any, Generic, TypeVar

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

logger = logging.getLogger(__name__)

BOOTSTRAP_TIMEOUT_ENV = "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"
DEFAULT_BOOTSTRAP_TIMEOUT_S = 300.0


def seconds_from_env(name: str, default: float) -> float:
    """A timeout in seconds from environment variable `name` (unset or blank: `default`);
    ValueError for anything but a positive number."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError as e:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from e
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {raw!r}")
    return value


def bootstrap_timeout_s() -> float:
    """Seconds a prefill room waits for its decode server (SGLang's variable and default)."""
    return seconds_from_env(BOOTSTRAP_TIMEOUT_ENV, DEFAULT_BOOTSTRAP_TIMEOUT_S)


# ---- rank registry ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PrefillRankInfo:
    rank_ip: str
    rank_port: int


@dataclass(frozen=True)
class PrefillServerInfo:
    attn_tp_size: int
    attn_cp_size: int
    dp_size: int
    pp_size: int
    page_size: int | None
    kv_cache_dtype: str | None
    follow_bootstrap_room: bool


class RegistrationError(ValueError):
    pass


class PrefillRegistry:
    """Which prefill rank serves KV where. The first registration fixes the layout; a later one
    that disagrees is refused (two prefill servers sharing a bootstrap port is a setup error)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._layout: PrefillServerInfo | None = None
        # (dp group, cp rank, tp rank, pp rank) -> where that rank listens
        self._ranks: dict[tuple[int, int, int, int], PrefillRankInfo] = {}

    def register(self, data: dict[str, Any]) -> tuple[int, int, int, int]:
        try:
            tp_size, tp_rank = int(data["attn_tp_size"]), int(data["attn_tp_rank"])
            rank = PrefillRankInfo(str(data["rank_ip"]), int(data["rank_port"]))
            # Optional in radixserve's own registrations (no context or pipeline parallelism
            # under disaggregation yet); SGLang's prefill ranks always send them.
            cp_size, cp_rank = int(data.get("attn_cp_size", 1)), int(data.get("attn_cp_rank", 0))
            dp_size, dp_rank = int(data.get("attn_dp_size", 1)), int(data.get("attn_dp_rank", 0))
            pp_size, pp_rank = int(data.get("pp_size", 1)), int(data.get("pp_rank", 0))
            sys_dp_size = int(data.get("system_dp_size", 1))
            sys_dp_rank = int(data.get("system_dp_rank", 0))
            page_size = None if data.get("page_size") is None else int(data["page_size"])
            kv_dtype = None if data.get("kv_cache_dtype") is None else str(data["kv_cache_dtype"])
            method = str(data.get("load_balance_method", "follow_bootstrap_room"))
        except KeyError as e:
            raise RegistrationError(f"missing field {e.args[0]!r}") from e
        except (TypeError, ValueError) as e:
            raise RegistrationError(f"bad field: {e}") from e
        # SGLang: with several server-level dp replicas the replica is the dp group, else the
        # attention dp rank is.
        layout = PrefillServerInfo(
            attn_tp_size=tp_size,
            attn_cp_size=cp_size,
            dp_size=dp_size if sys_dp_size == 1 else sys_dp_size,
            pp_size=pp_size,
            page_size=page_size,
            kv_cache_dtype=kv_dtype,
            follow_bootstrap_room=method == "follow_bootstrap_room",
        )
        dp_group = dp_rank if sys_dp_size == 1 else sys_dp_rank
        key = (dp_group, cp_rank, tp_rank, pp_rank)
        for index, size in zip(key, (layout.dp_size, cp_size, tp_size, pp_size), strict=True):
            if not 0 <= index < size:
                raise RegistrationError(f"rank {key} outside the layout {asdict(layout)}")
        with self._lock:
            if self._layout is None:
                self._layout = layout
            elif self._layout != layout:
                raise RegistrationError(
                    f"layout {asdict(layout)} differs from the registered {asdict(self._layout)}"
                )
            self._ranks[key] = rank
        logger.info(
            "bootstrap: prefill rank dp%d cp%d tp%d pp%d at %s:%d", *key, *asdict(rank).values()
        )
        return key

    def expected(self) -> int:
        layout = self._layout
        if layout is None:
            return 0
        return layout.dp_size * layout.attn_cp_size * layout.attn_tp_size * layout.pp_size

    def ready(self) -> bool:
        with self._lock:
            return self._layout is not None and len(self._ranks) >= self.expected()

    def server_info(self) -> PrefillServerInfo | None:
        return self._layout if self.ready() else None

    def lookup(self, dp: int, cp: int, tp: int, pp: int) -> PrefillRankInfo | None:
        with self._lock:
            return self._ranks.get((dp, cp, tp, pp))

    def registered(self) -> int:
        with self._lock:
            return len(self._ranks)


# ---- rooms ------------------------------------------------------------------------------------

T = TypeVar("T")


class RoomError(KeyError):
    pass


@dataclass
class _Room(Generic[T]):
    payload: T
    deadline: float
    claimed: bool = False


class RoomTable(Generic[T]):
    """Rooms (`bootstrap_room` -> payload: a prefill's KV pages and first token) from the moment
    the prefill has them until the transfer ends (`release`). A room its decode never claims
    expires `timeout_s` after it opened: `reap()` removes it and passes it to `on_expire`, which
    frees its pages; a claim that comes later is told it expired, not that the room is unknown.
    A claimed room does not expire here: the transfer owns it then."""

    def __init__(
        self,
        timeout_s: float | None = None,
        on_expire: Callable[[int, T], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout_s = bootstrap_timeout_s() if timeout_s is None else timeout_s
        self._on_expire = on_expire
        self._clock = clock
        self._lock = threading.Lock()
        self._rooms: dict[int, _Room[T]] = {}
        # room -> when to forget that it expired; bounded by one more timeout.
        self._expired: dict[int, float] = {}

    def open(self, room: int, payload: T) -> None:
        with self._lock:
            if room in self._rooms:
                # A room names one request; reusing it would hand one request's KV to another.
                raise RoomError(f"bootstrap room {room} is already open")
            self._expired.pop(room, None)
            self._rooms[room] = _Room(payload, self._clock() + self.timeout_s)

    def claim(self, room: int) -> T:
        with self._lock:
            state = self._rooms.get(room)
            if state is None or (not state.claimed and self._clock() >= state.deadline):
                expired = room in self._expired or state is not None
                raise RoomError(
                    f"bootstrap room {room} "
                    + (
                        f"expired: not claimed within {self.timeout_s:g}s ({BOOTSTRAP_TIMEOUT_ENV})"
                        if expired
                        else "is unknown"
                    )
                )
            if state.claimed:
                raise RoomError(f"bootstrap room {room} is already claimed")
            state.claimed = True
            return state.payload

    def state(self, room: int) -> str:
        """ "open", "claimed", "expired" (recently) or "unknown" (not opened yet, or long gone):
        a decode that asks before its prefill finished waits on "unknown"."""
        with self._lock:
            found = self._rooms.get(room)
            if found is not None:
                if found.claimed:
                    return "claimed"
                return "expired" if self._clock() >= found.deadline else "open"
            return "expired" if room in self._expired else "unknown"

    def release(self, room: int) -> T | None:
        """The transfer for `room` ended (either way); the caller frees what the payload holds."""
        with self._lock:
            state = self._rooms.pop(room, None)
        return None if state is None else state.payload

    def reap(self) -> list[tuple[int, T]]:
        now = self._clock()
        with self._lock:
            gone = [r for r, s in self._rooms.items() if not s.claimed and now >= s.deadline]
            expired = [(r, self._rooms.pop(r).payload) for r in gone]
            for r in gone:
                self._expired[r] = now + self.timeout_s
            self._expired = {r: t for r, t in self._expired.items() if t > now}
        for room, payload in expired:
            logger.warning(
                "bootstrap room %d expired: no decode claimed it within %gs", room, self.timeout_s
            )
            if self._on_expire is not None:
                self._on_expire(room, payload)
        return expired

    def __len__(self) -> int:
        with self._lock:
            return len(self._rooms)

    def __contains__(self, room: object) -> bool:
        with self._lock:
            return room in self._rooms


# ---- HTTP server ------------------------------------------------------------------------------

_GET_PARAMS = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")


def build_app(
    registry: PrefillRegistry, rooms: RoomTable[Any] | None = None, reap_interval_s: float = 1.0
) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Expiry must not depend on traffic: a prefill whose decode died gets no more requests
        # for that room, yet its pages have to come back.
        task = asyncio.create_task(_reaper(rooms, reap_interval_s)) if rooms is not None else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()

    app = FastAPI(title="radixserve disaggregation bootstrap", lifespan=lifespan)

    @app.get("/health")
    async def health() -> Response:
        return PlainTextResponse("OK")

    @app.put("/route")
    async def put_route(request: Request) -> Response:
        try:
            data = await request.json()
        except ValueError:
            return PlainTextResponse("Body is not JSON.", status_code=400)
        if not isinstance(data, dict):
            return PlainTextResponse("Body must be a JSON object.", status_code=400)
        try:
            registry.register(data)
        except RegistrationError as e:
            return PlainTextResponse(f"Bad registration: {e}", status_code=400)
        return PlainTextResponse("OK")

    @app.get("/route")
    async def get_route(request: Request) -> Response:
        raw = [request.query_params.get(name) for name in _GET_PARAMS]
        if any(not v for v in raw):
            return PlainTextResponse("Missing inputs for bootstrap server.", status_code=400)
        try:
            dp, cp, tp, pp = (int(v) for v in raw)  # type: ignore[arg-type]
        except ValueError:
            return PlainTextResponse("Rank parameters must be integers.", status_code=400)
        if not registry.ready():
            return PlainTextResponse(
                "Prefill server not fully registered yet "
                f"({registry.registered()} workers registered).",
                status_code=503,
            )
        if (dp, cp, tp, pp) == (-1, -1, -1, -1):
            info = registry.server_info()
            assert info is not None  # ready() held a moment ago and layouts never unregister
            return JSONResponse(asdict(info))
        found = registry.lookup(dp, cp, tp, pp)
        if found is None:
            return PlainTextResponse(
                f"Bootstrap info not found for dp_rank={dp} cp_rank={cp} tp_rank={tp} pp_rank={pp}",
                status_code=404,
            )
        return JSONResponse(asdict(found))

    return app


async def _reaper(rooms: RoomTable[Any] | None, interval_s: float) -> None:
    assert rooms is not None
    while True:
        await asyncio.sleep(interval_s)
        try:
            rooms.reap()
        except Exception:  # an on_expire callback must not stop expiry for good
            logger.exception("bootstrap room reaper")


class BootstrapServer:
    """The bootstrap HTTP server on a daemon thread (the prefill scheduler's process keeps its
    own loop). `port=0` picks a free port; `.port` is the one bound."""

    def __init__(
        self,
        host: str = "0.0.0.0",
        port: int = 8998,
        rooms: RoomTable[Any] | None = None,
        reap_interval_s: float = 1.0,
    ) -> None:
        self.registry = PrefillRegistry()
        self.rooms = rooms
        self.host = host
        # Bind here, not in the thread: a port in use fails the caller at once, and port 0
        # resolves before anyone needs to know it.
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError:
            self._sock.close()
            raise
        self.port: int = self._sock.getsockname()[1]
        app = build_app(self.registry, rooms, reap_interval_s)
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self._sock]},
            daemon=True,
            name="pd-bootstrap",
        )

    def start(self, timeout_s: float = 10.0) -> BootstrapServer:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"bootstrap server on {self.host}:{self.port} did not start")
            time.sleep(0.01)
        return self

    def close(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._sock.close()

    def __enter__(self) -> BootstrapServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- client side (what the prefill ranks and the decode side call) ----------------------------


def register_prefill_rank(url: str, payload: dict[str, Any], timeout_s: float = 5.0) -> None:
    """PUT /route for one prefill rank; raises on anything but 200."""
    r = httpx.put(f"{url}/route", json=payload, timeout=timeout_s)
    if r.status_code != 200:
        raise RegistrationError(f"bootstrap server {url} refused registration: {r.text}")


def fetch_prefill_server_info(url: str, timeout_s: float = 5.0) -> PrefillServerInfo | None:
    """The prefill layout, or None while not every rank has registered (503)."""
    r = httpx.get(f"{url}/route", params=dict.fromkeys(_GET_PARAMS, -1), timeout=timeout_s)
    if r.status_code == 503:
        return None
    r.raise_for_status()
    return PrefillServerInfo(**r.json())


def fetch_prefill_rank(
    url: str, dp: int, cp: int, tp: int, pp: int, timeout_s: float = 5.0
) -> PrefillRankInfo | None:
    """Where one prefill rank serves KV, or None when no such rank registered."""
    params = dict(zip(_GET_PARAMS, (dp, cp, tp, pp), strict=True))
    r = httpx.get(f"{url}/route", params=params, timeout=timeout_s)
    if r.status_code == 404:
        return None
    r.raise_for_status()
    return PrefillRankInfo(**r.json())
