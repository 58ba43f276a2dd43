"""Scheduler-side rules of SGLang's runtime controls that are not sessions: request time
limits, priority preemption, and pause modes. Pure decisions over Req lists; the Scheduler
applies them (retract, finish), so every request still ends once and frees its KV there.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixserve.errors import InvalidRequestError

if TYPE_CHECKING:
    from radixserve.managers.schedule_batch import Req
    from radixserve.server_args import ServerArgs

# SGLang reads these from the environment (seconds; <= 0 turns the limit off).
WAITING_TIMEOUT_ENV = "SGLANG_REQ_WAITING_TIMEOUT"
RUNNING_TIMEOUT_ENV = "SGLANG_REQ_RUNNING_TIMEOUT"
WAITING_TIMEOUT_MESSAGE = "Request waiting timeout reached."
RUNNING_TIMEOUT_MESSAGE = "Request running timeout reached."
PRIORITY_DISABLED_MESSAGE = (
    "Using priority is disabled for this server. Please send a new request without a priority."
)
PAUSE_MODES = ("abort", "retract", "in_place")


def _env_seconds(name: str) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return -1.0
    try:
        return float(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from exc


@dataclass(frozen=True)
class TimeLimits:
    waiting_s: float = -1.0  # from arrival until first scheduled
    running_s: float = -1.0  # from first scheduled until finished

    @classmethod
    def from_env(cls) -> TimeLimits:
        return cls(_env_seconds(WAITING_TIMEOUT_ENV), _env_seconds(RUNNING_TIMEOUT_ENV))

    @property
    def active(self) -> bool:
        return self.waiting_s > 0 or self.running_s > 0

    def expired(
        self, waiting: Sequence[Req], running: Sequence[Req], now: float | None = None
    ) -> list[tuple[Req, str]]:
        """Requests past a limit, each with the message it ends with.

        The waiting limit applies to requests that never ran (a retracted request already
        waited its turn once); the running limit to every request that has run, wherever it is.
        """
        now = time.monotonic() if now is None else now
        out: list[tuple[Req, str]] = []
        for req in waiting:
            started = req.first_scheduled_time
            if started is None:
                if self.waiting_s > 0 and now - req.arrival_time > self.waiting_s:
                    out.append((req, WAITING_TIMEOUT_MESSAGE))
            elif self.running_s > 0 and now - started > self.running_s:
                out.append((req, RUNNING_TIMEOUT_MESSAGE))
        if self.running_s > 0:
            for req in running:
                started = req.first_scheduled_time
                if started is not None and now - started > self.running_s:
                    out.append((req, RUNNING_TIMEOUT_MESSAGE))
        return out


@dataclass(frozen=True)
class Preemption:
    """--enable-priority-scheduling preemption: a waiting request may take the place of running
    requests whose priority is worse by more than the threshold (SGLang's rule)."""

    enabled: bool = False
    threshold: int = 10
    low_values_first: bool = False

    @classmethod
    def from_args(cls, args: ServerArgs) -> Preemption:
        return cls(
            enabled=bool(args.enable_priority_scheduling and not args.disable_priority_preemption),
            threshold=int(args.priority_scheduling_preemption_threshold),
            low_values_first=bool(args.schedule_low_priority_values_first),
        )

    def outranks(self, req: Req, other: Req) -> bool:
        diff = (
            other.priority - req.priority
            if self.low_values_first
            else req.priority - other.priority
        )
        return diff > self.threshold

    def victims(
        self, req: Req, running: Sequence[Req], fits: Callable[[Sequence[Req]], bool]
    ) -> list[Req]:
        """The fewest, least-preferred running requests whose retraction lets `req` in
        (`fits(retracted)` says whether it would); [] when none (or not enough) may go."""
        if not self.enabled:
            return []
        # Worst first: lowest priority (or highest, when low values run first), then the
        # request with the least output (cheapest to redo).
        sign = -1 if self.low_values_first else 1
        candidates = sorted(
            (r for r in running if self.outranks(req, r)),
            key=lambda r: (sign * r.priority, len(r.output_ids)),
        )
        chosen: list[Req] = []
        for victim in candidates:
            chosen.append(victim)
            if fits(chosen):
                return chosen
        return []


def check_pause_mode(mode: str) -> None:
    if mode not in PAUSE_MODES:
        raise InvalidRequestError(
            f"mode must be one of {', '.join(PAUSE_MODES)}; got {mode!r}", "mode"
        )
