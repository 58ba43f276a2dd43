"""Server lifecycle (ready, draining, dead) and admission of generation requests.

Admission counts generation units (one prompt times one sample) that the HTTP layer handed to
the engine and that have not finished. With `--max-queued-requests`, the units beyond the
running capacity (`--max-running-requests`, else what the engine reports, else 0, which makes
the bound count every unit in flight) may not exceed the bound: the next request gets 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from radixserve.entrypoints.http_config import HttpConfig
from radixserve.entrypoints.openai.errors import ApiError

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 1


class Ticket:
    """Admission of `units` generation units; `release` is idempotent."""

    def __init__(self, state: ServerState, units: int) -> None:
        self._state = state
        self.units = units
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._state.inflight -= self.units


@dataclass
class ServerState:
    """Shared by the routes, the lifespan tasks and the signal handler (one event loop)."""

    config: HttpConfig
    ready: bool = False
    draining: bool = False
    dead_reason: str | None = None
    inflight: int = 0
    # Requests the engine runs at once; set from --max-running-requests or the engine.
    running_capacity: int = 0
    started_at: float = field(default_factory=time.time)

    @property
    def healthy(self) -> bool:
        return self.ready and not self.draining and self.dead_reason is None

    def unavailable_reason(self) -> str | None:
        if self.dead_reason is not None:
            return "The engine is not running."
        if self.draining:
            return "The server is shutting down."
        return None

    def admit(self, units: int) -> Ticket:
        """Admit a request of `units` generation units or raise a 503 ApiError."""
        reason = self.unavailable_reason()
        if reason is not None:
            raise ApiError(503, reason, headers={"Retry-After": str(RETRY_AFTER_S)})
        bound = self.config.max_queued_requests
        if bound is not None:
            waiting = self.inflight + units - self.running_capacity
            if waiting > bound:
                raise ApiError(
                    503,
                    f"The request queue is full ({bound} queued requests at most); retry later.",
                    headers={"Retry-After": str(RETRY_AFTER_S)},
                )
        self.inflight += units
        return Ticket(self, units)

    async def drain(self, grace_s: float) -> bool:
        """Stop admitting; wait up to `grace_s` for in-flight work. True if it all finished."""
        self.draining = True
        deadline = time.monotonic() + grace_s
        logger.info("Draining: waiting up to %.0f s for %d requests", grace_s, self.inflight)
        while self.inflight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.inflight > 0:
            logger.warning("Grace period over with %d requests still running", self.inflight)
            return False
        return True
