"""The request-to-token table: (request slot, position) -> KV slot index."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch

from radixserve.mem_cache.allocator import as_int_arg

logger = logging.getLogger(__name__)


class ReqToTokenPool:
    """Maps (request slot, position) -> KV slot index.

    `req_to_token[r, i]` is the KV-pool slot of token i of the request holding row r. Rows are
    handed out by `alloc` and returned by `free`; a row is held by at most one request. Only the
    positions a request has written are meaningful: rows are not cleared on free, so a reader
    must stay within the lengths it wrote.
    """

    def __init__(
        self, max_reqs: int, max_context_len: int, device: str | torch.device = "cpu"
    ) -> None:
        if isinstance(max_reqs, bool) or not isinstance(max_reqs, int) or max_reqs < 1:
            raise ValueError(f"max_reqs must be a positive int, got {max_reqs!r}")
        if (
            isinstance(max_context_len, bool)
            or not isinstance(max_context_len, int)
            or max_context_len < 1
        ):
            raise ValueError(f"max_context_len must be a positive int, got {max_context_len!r}")
        self.max_reqs = max_reqs
        self.max_context_len = max_context_len
        self.device = torch.device(device)
        self.req_to_token = torch.zeros(
            (max_reqs, max_context_len), dtype=torch.int64, device=self.device
        )
        self._in_use = np.zeros(max_reqs, dtype=bool)
        self._free_rows: list[int] = []
        # Told (row, start) on every write: tensor-parallel rank 0 uses it to know which parts
        # of its table the other ranks' copies lack.
        self.on_write: Callable[[int, int], None] | None = None
        self.clear()

    def available_size(self) -> int:
        """Number of free request rows."""
        return len(self._free_rows)

    def alloc(self) -> int | None:
        """A free row index (lowest first on a fresh pool), or None when all are taken."""
        if not self._free_rows:
            return None
        row = self._free_rows.pop()
        self._in_use[row] = True
        return row

    def free(self, req_pool_idx: int) -> None:
        """Return a row; freeing a row that is not held raises RuntimeError."""
        row = self._check_row(req_pool_idx, must_be_held=False)
        if not self._in_use[row]:
            raise RuntimeError(f"double free of req_pool_idx {row}")
        self._in_use[row] = False
        self._free_rows.append(row)

    def clear(self) -> None:
        """Every row free again."""
        self._in_use = np.zeros(self.max_reqs, dtype=bool)
        # Popped from the end, so the lowest row is handed out first.
        self._free_rows = list(range(self.max_reqs - 1, -1, -1))

    def write(self, req_pool_idx: int, start: int, slots: torch.Tensor) -> None:
        """Store `slots` at positions [start, start + len(slots)) of the row."""
        row = self._check_row(req_pool_idx)
        if not isinstance(slots, torch.Tensor):
            raise TypeError(f"slots must be a torch.Tensor, got {type(slots).__name__}")
        if slots.dim() != 1:
            raise ValueError(f"slots must be 1-D, got shape {tuple(slots.shape)}")
        start = as_int_arg("start", start)
        end = start + slots.numel()
        self._check_span(start, end)
        self.req_to_token[row, start:end] = slots.to(self.req_to_token.device, torch.int64)
        if self.on_write is not None:
            self.on_write(row, start)

    def last_slots(self, rows: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The slot at position lengths[i] - 1 of row rows[i] (the last one each holds), or -1
        where lengths[i] is 0, as an int64 array: a decode step's one gather."""
        rows = self._held_rows(rows)
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.shape != rows.shape:
            raise ValueError("rows and lengths must be 1-D of one length")
        if rows.size == 0:
            return np.empty(0, dtype=np.int64)
        self._check_span(int(lengths.min()), int(lengths.max()))
        last = np.maximum(lengths - 1, 0)
        if self.device.type == "cpu":
            found = self.req_to_token.numpy()[rows, last]
        else:
            index = torch.from_numpy(rows).to(self.device), torch.from_numpy(last).to(self.device)
            found = self.req_to_token[index].cpu().numpy()
        return np.where(lengths > 0, found, -1)

    def write_tokens(self, rows: np.ndarray, positions: np.ndarray, slots: torch.Tensor) -> None:
        """Store slots[i] at (rows[i], positions[i]) for every i in one indexed write (a decode
        step's new tokens); rows must be held and positions inside the table. The indices come
        as numpy arrays: on a CPU table the gather and the write are numpy indexing, with no
        torch call (each of which released and re-took the GIL, costly at batch 64 while the
        engine's other threads run)."""
        rows = self._held_rows(rows)
        positions = np.asarray(positions, dtype=np.int64)
        if not (rows.shape == positions.shape == tuple(slots.shape)):
            raise ValueError(
                f"rows, positions and slots must be 1-D of one length, got "
                f"{rows.shape}, {positions.shape}, {tuple(slots.shape)}"
            )
        if rows.size == 0:
            return
        self._check_span(int(positions.min()), int(positions.max()) + 1)
        if self.device.type == "cpu":
            self.req_to_token.numpy()[rows, positions] = slots.cpu().numpy()
        else:
            index = (
                torch.from_numpy(rows).to(self.device),
                torch.from_numpy(positions).to(self.device),
            )
            self.req_to_token[index] = slots.to(self.device, torch.int64)
        if self.on_write is not None:
            for row, start in zip(rows.tolist(), positions.tolist(), strict=True):
                self.on_write(row, start)

    def _held_rows(self, rows: np.ndarray) -> np.ndarray:
        """`rows` as a 1-D int64 array, each inside the table and held."""
        rows = np.asarray(rows)
        if rows.ndim != 1 or (rows.size and rows.dtype.kind not in "iu"):
            raise ValueError(f"rows must be a 1-D integer array, got {rows.dtype} {rows.shape}")
        rows = rows.astype(np.int64, copy=False)
        if rows.size == 0:
            return rows
        lo, hi = int(rows.min()), int(rows.max())
        if lo < 0 or hi >= self.max_reqs:
            raise ValueError(
                f"req_pool_idx must be in [0, {self.max_reqs}), got {lo if lo < 0 else hi}"
            )
        if not self._in_use[rows].all():
            raise RuntimeError(f"req_pool_idx {int(rows[~self._in_use[rows]][0])} is not allocated")
        return rows

    def read(self, req_pool_idx: int, start: int, end: int) -> torch.Tensor:
        """A copy of positions [start, end) of the row (safe to keep across later writes)."""
        row = self._check_row(req_pool_idx)
        start, end = as_int_arg("start", start), as_int_arg("end", end)
        self._check_span(start, end)
        return self.req_to_token[row, start:end].clone()

    def _check_row(self, req_pool_idx: int, must_be_held: bool = True) -> int:
        row = as_int_arg("req_pool_idx", req_pool_idx)
        if not 0 <= row < self.max_reqs:
            raise ValueError(f"req_pool_idx must be in [0, {self.max_reqs}), got {row}")
        if must_be_held and not self._in_use[row]:
            raise RuntimeError(f"req_pool_idx {row} is not allocated")
        return row

    def _check_span(self, start: int, end: int) -> None:
        if not 0 <= start <= end <= self.max_context_len:
            raise ValueError(
                f"positions [start={start}, end={end}) must lie within "
                f"[0, max_context_len={self.max_context_len}]"
            )
