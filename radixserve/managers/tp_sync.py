"""Rank 0 tells the other tensor-parallel ranks what to run; they run the same forward steps.

Each step, rank 0 broadcasts a TpStep: the StepInputs and the parts of its request-to-token
table the other ranks have not seen yet (per row, from the first position written since that
row was last sent). Their copies of the table then match rank 0's wherever the step reads, so
attention reads the same KV slots on every rank, each rank's pool holding its own heads for
those slots. The model's collectives (all-reduce, all-gather) pair up because every rank runs
the same ops on the same shapes. Sampling happens on rank 0 only (every rank gets the full
logits; the others drop them).

While rank 0 is idle it broadcasts a heartbeat now and then, so the other ranks' wait never
reaches --dist-timeout; a rank that dies shows up as a failed collective on the others.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixserve.distributed import parallel_state as ps
from radixserve.distributed.launch import RankLostError

if TYPE_CHECKING:
    from radixserve.mem_cache.req_to_token_pool import ReqToTokenPool
    from radixserve.model_executor.model_runner import ModelRunner
    from radixserve.model_executor.step_io import StepInputs

logger = logging.getLogger(__name__)

MAX_HEARTBEAT_S = 5.0


@dataclass(frozen=True)
class RowUpdate:
    """req_to_token[row, start : start + len(slots)] = slots."""

    row: int
    start: int
    slots: torch.Tensor


@dataclass(frozen=True)
class TpStep:
    step: StepInputs
    rows: tuple[RowUpdate, ...]
    # A step that reads a table of its own (speculative tree verification) instead of the
    # request-to-token table carries it whole.
    table: torch.Tensor | None = None


@dataclass(frozen=True)
class TpKvCopy:
    """kv_cache.copy_slots(src, dst) on every rank."""

    src: torch.Tensor
    dst: torch.Tensor


@dataclass(frozen=True)
class TpHeartbeat:
    pass


@dataclass(frozen=True)
class TpShutdown:
    pass


def heartbeat_interval(timeout_s: int) -> float:
    # Well inside the timeout, and often enough that a dead rank is noticed while idle.
    return max(0.5, min(timeout_s / 4, MAX_HEARTBEAT_S))


class TpLeader:
    """Rank 0's side: hooks into the runner (each forward is broadcast first) and the request
    pool (writes mark rows as needing a resend)."""

    def __init__(self, runner: ModelRunner, pool: ReqToTokenPool, timeout_s: int) -> None:
        self._synced: dict[int, int] = {}  # row -> positions the other ranks hold
        self._interval = heartbeat_interval(timeout_s)
        self._last_sent = time.monotonic()
        self._table = pool.req_to_token
        pool.on_write = self._written
        runner.step_broadcaster = self.broadcast_step
        runner.kv_copy_broadcaster = self.broadcast_kv_copy

    def _written(self, row: int, start: int) -> None:
        if self._synced.get(row, 0) > start:
            self._synced[row] = start

    def broadcast_step(self, step: StepInputs, req_to_token: torch.Tensor) -> None:
        if req_to_token is not self._table:
            self._send(TpStep(step, (), table=req_to_token.clone()))
            return
        updates = []
        for row, prefix, extend in zip(
            step.req_pool_indices, step.prefix_lens, step.extend_lens, strict=True
        ):
            start, end = self._synced.get(row, 0), prefix + extend
            if start < end:
                updates.append(RowUpdate(row, start, req_to_token[row, start:end].clone()))
                self._synced[row] = end
        self._send(TpStep(step, tuple(updates)))

    def broadcast_kv_copy(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        self._send(TpKvCopy(src.clone(), dst.clone()))

    def heartbeat_if_due(self) -> None:
        if time.monotonic() - self._last_sent >= self._interval:
            self._send(TpHeartbeat())

    def shutdown(self) -> None:
        """Tell the other ranks to exit (best effort: one of them may be the reason we stop)."""
        with contextlib.suppress(RankLostError):
            self._send(TpShutdown())

    def _send(self, msg: object) -> None:
        try:
            ps.broadcast_object(msg, src=0)
        except Exception as exc:
            raise RankLostError(f"broadcast to the other TP ranks failed: {exc}") from exc
        self._last_sent = time.monotonic()


def follow(runner: ModelRunner, req_to_token: torch.Tensor) -> None:
    """A rank > 0: run every step rank 0 broadcasts until it says stop. Any failure (a
    collective that errs or times out) raises RankLostError."""
    while True:
        try:
            msg = ps.broadcast_object(None, src=0)
        except Exception as exc:
            raise RankLostError(f"waiting for rank 0 failed: {exc}") from exc
        if isinstance(msg, TpShutdown):
            return
        if isinstance(msg, TpHeartbeat):
            continue
        if isinstance(msg, TpKvCopy):
            runner.kv_cache.copy_slots(msg.src, msg.dst)
            continue
        if not isinstance(msg, TpStep):
            raise RankLostError(f"unexpected message from rank 0: {type(msg).__name__}")
        for update in msg.rows:
            req_to_token[update.row, update.start : update.start + len(update.slots)] = update.slots
        try:
            runner.forward(msg.step, req_to_token if msg.table is None else msg.table)
        except Exception as exc:
            raise RankLostError(f"forward step failed: {exc}") from exc


def exit_rank(rank: int, reason: str) -> None:
    """Log why this rank stops and leave at once: a process group whose peer is gone can hang
    the interpreter's normal exit."""
    logger.error("TP rank %d: %s; exiting", rank, reason)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(1)
