"""Page-granular allocator of token slots in the KV pool (who holds which KV slot)."""

from __future__ import annotations

import logging
import operator

import numpy as np
import torch

logger = logging.getLogger(__name__)


def as_int_arg(name: str, value: object) -> int:
    """Python int from an int-like (int, numpy integer, 0-d integer tensor); never a bool."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{name} must be an int, got {value!r}") from None


class TokenToKVPoolAllocator:
    """Page-granular free list over `size` token slots [0, size); size is a multiple of page_size.

    A page belongs to one owner at a time (a request or the prefix cache). Slots of a page are
    contiguous: page p holds slots [p * page_size, (p + 1) * page_size).

    Invariants:
      * a page is either on the free stack exactly once (and marked free) or owned by someone;
      * `available_size() == free pages * page_size`;
      * freeing a page that is already free raises RuntimeError (a conservation bug upstream).

    The bookkeeping is numpy on the host whatever `device` is: alloc/free run every decode step
    and small torch ops cost tens of microseconds each, while the scheduler needs host values
    (available_size, double-free checks) anyway. Returned slots are moved to `device`, the
    device of the KV pool and req_to_token.
    """

    def __init__(self, size: int, page_size: int = 1, device: str | torch.device = "cpu") -> None:
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be a positive int, got {page_size!r}")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be a positive int, got {size!r}")
        if size % page_size != 0:
            raise ValueError(f"size ({size}) must be a multiple of page_size ({page_size})")
        self.size = size
        self.page_size = page_size
        self.device = torch.device(device)
        self.num_pages = size // page_size
        # Within-page offsets, reused to expand page ids into slot ids without Python loops.
        self._page_offsets = np.arange(page_size, dtype=np.int64)
        self._free_stack = np.empty(self.num_pages, dtype=np.int64)
        self._is_free = np.empty(self.num_pages, dtype=np.bool_)
        self._num_free = 0
        self.clear()

    def available_size(self) -> int:
        """Free tokens: free pages times page_size."""
        return self._num_free * self.page_size

    def clear(self) -> None:
        """Mark every page free; the stack pops low page ids first."""
        self._free_stack[:] = np.arange(self.num_pages - 1, -1, -1, dtype=np.int64)
        self._is_free[:] = True
        self._num_free = self.num_pages

    def alloc(self, num_tokens: int, last_loc: int = -1) -> torch.Tensor | None:
        """Slots (int64, 1-D, on `device`) for `num_tokens` new tokens of one sequence.

        The new tokens follow a token stored at slot `last_loc` (-1: the sequence starts fresh).
        With page_size > 1 they first fill the rest of last_loc's page (slots last_loc + 1 up
        to the page end), then whole new pages in order. Returns None, allocating nothing, when
        there are not enough free pages. num_tokens == 0 gives an empty tensor.
        """
        num_tokens = as_int_arg("num_tokens", num_tokens)
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        last_loc = as_int_arg("last_loc", last_loc)
        fill = min(self._tail_room(last_loc), num_tokens)
        rest = num_tokens - fill
        need_pages = -(-rest // self.page_size)
        if need_pages > self._num_free:
            return None
        if need_pages == 0:
            out = np.arange(last_loc + 1, last_loc + 1 + fill, dtype=np.int64)
        else:
            pages = self._pop_pages(need_pages)
            if self.page_size == 1:
                out = pages
            else:
                out = (pages[:, None] * self.page_size + self._page_offsets).reshape(-1)[:rest]
            if fill:
                head = np.arange(last_loc + 1, last_loc + 1 + fill, dtype=np.int64)
                out = np.concatenate([head, out])
        # `out` is always a fresh array, so the tensor may share its memory.
        return torch.from_numpy(out).to(self.device)

    def alloc_decode(
        self, last_locs: np.ndarray, widths: np.ndarray | None = None
    ) -> torch.Tensor | None:
        """New slots for each of a batch of sequences, in one call (a decode step, or a
        speculative round whose requests take 1 + their drafts).

        `last_locs[i]` is the slot of sequence i's last stored token (-1: none yet) and
        `widths[i]` (default 1) the number of new slots it takes; the result holds sequence
        0's slots, then sequence 1's, and so on. With larger pages a sequence first fills the
        rest of its last page, then takes fresh pages. Same slots, sequence by sequence, as
        calling `alloc(widths[i], last_locs[i])` in order, but without the per-call argument
        checks and tensor conversions that dominate at batch 64. Returns None, allocating
        nothing, when there are not enough free pages.
        """
        last_locs = np.asarray(last_locs, dtype=np.int64).reshape(-1)
        n = last_locs.size
        if widths is not None:
            widths = np.asarray(widths, dtype=np.int64).reshape(-1)
            if widths.size != n or (n and int(widths.min()) < 0):
                raise ValueError("widths must hold one count >= 0 per sequence")
            if n and int(widths.max()) == 1 and int(widths.min()) == 1:
                widths = None
        if n == 0:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        held = last_locs >= 0
        if held.any():
            locs = last_locs[held]
            if int(locs.max()) >= self.size:
                raise ValueError(f"last_loc out of range [0, {self.size}): {int(locs.max())}")
            if self._is_free[locs // self.page_size].any():
                raise RuntimeError("a last_loc lies in a free page")
        if widths is not None:
            out = self._alloc_widths(last_locs, held, widths)
            return None if out is None else torch.from_numpy(out).to(self.device)
        if self.page_size == 1:
            if n > self._num_free:
                return None
            out = self._pop_pages(n)
        else:
            # A sequence continues in its page unless it has none or the page is full.
            fresh = ~held | ((last_locs + 1) % self.page_size == 0)
            need = int(fresh.sum())
            if need > self._num_free:
                return None
            out = last_locs + 1
            if need:
                out[fresh] = self._pop_pages(need) * self.page_size
        return torch.from_numpy(out).to(self.device)

    def _alloc_widths(
        self, last_locs: np.ndarray, held: np.ndarray, widths: np.ndarray
    ) -> np.ndarray | None:
        """alloc_decode's slots when sequences take different numbers of slots."""
        total = int(widths.sum())
        if self.page_size == 1:
            return None if total > self._num_free else self._pop_pages(total)
        ps = self.page_size
        tail = np.where(held, (ps - (last_locs + 1) % ps) % ps, 0)
        fill = np.minimum(tail, widths)
        num_pages = -(-(widths - fill) // ps)
        need = int(num_pages.sum())
        if need > self._num_free:
            return None
        pages = self._pop_pages(need) if need else np.empty(0, dtype=np.int64)
        # Slot j of sequence i: the rest of its last page first, then its fresh pages in order.
        seq = np.repeat(np.arange(last_locs.size), widths)
        j = np.arange(total) - np.repeat(np.cumsum(widths) - widths, widths)
        past_fill = j - fill[seq]
        first_page = np.cumsum(num_pages) - num_pages
        page = pages[np.clip(first_page[seq] + past_fill // ps, 0, max(need - 1, 0))] if need else 0
        return np.where(past_fill < 0, last_locs[seq] + 1 + j, page * ps + past_fill % ps)

    def free(self, slots: torch.Tensor) -> None:
        """Free the pages that contain `slots` (each page once, duplicates allowed).

        Raises RuntimeError if one of those pages is already free, and ValueError for slots
        outside [0, size); in both cases nothing is freed.
        """
        if not isinstance(slots, torch.Tensor):
            raise TypeError(f"slots must be a torch.Tensor, got {type(slots).__name__}")
        if slots.numel() == 0:
            return
        flat = slots.reshape(-1).to(device="cpu", dtype=torch.int64).numpy()
        lo, hi = int(flat.min()), int(flat.max())
        if lo < 0 or hi >= self.size:
            raise ValueError(f"slots out of range [0, {self.size}): min {lo}, max {hi}")
        pages = flat // self.page_size if self.page_size > 1 else flat
        if pages.size > 1:
            pages = np.unique(pages)  # a page is freed once however many of its slots come
        already = self._is_free[pages]
        if already.any():
            bad = pages[already][:8].tolist()
            raise RuntimeError(f"double free of KV pages {bad} (page_size={self.page_size})")
        self._is_free[pages] = True
        n = pages.size
        self._free_stack[self._num_free : self._num_free + n] = pages
        self._num_free += n

    def _tail_room(self, last_loc: int) -> int:
        """Unused slots after `last_loc` in its page (0 for page_size 1 or a fresh sequence)."""
        if last_loc == -1:
            return 0
        if not 0 <= last_loc < self.size:
            raise ValueError(f"last_loc must be -1 or in [0, {self.size}), got {last_loc}")
        if self.page_size == 1:
            return 0
        page = last_loc // self.page_size
        if self._is_free[page]:
            raise RuntimeError(f"last_loc {last_loc} lies in page {page}, which is free")
        return (page + 1) * self.page_size - (last_loc + 1)

    def _pop_pages(self, n: int) -> np.ndarray:
        """Take n pages off the stack (as a fresh array) and mark them owned."""
        top = self._num_free
        # Reversed so that a fresh allocator hands out ascending page ids: a sequence's pages
        # then tend to be contiguous.
        pages = self._free_stack[top - n : top][::-1].copy()
        self._is_free[pages] = False
        self._num_free = top - n
        return pages
