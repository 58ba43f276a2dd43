"""Apply a batch's packed grammar bitmask to its logits in place.

The scheduler fills one int32 row per constrained request (``GrammarMatcher.fill_packed``) and
hands the sampler a ``PackedVocabMask``; the sampler sets the disallowed logits of those rows to
-inf here. On the CPU that is xgrammar's own kernel when xgrammar is installed; otherwise (or on
another device) a torch version that unpacks only the constrained rows, one byte per token, and
never builds a [batch, vocab] int32 or bool mask for the whole batch.

llguidance's ``apply_token_bitmask_inplace`` is not used: it is a ``torch.compile`` of the same
unpacking, whose first call compiles for ~30 s on the CPU (inside a scheduler step), and it has
no row selection.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from radixserve.sampling.constrained.bitmask import bitmask_words

# Kernel signature: (logits, bitmask, vocab_size, rows) -> None, masking logits[r, :vocab_size].
Kernel = Callable[[torch.Tensor, torch.Tensor, int, list[int]], None]


@dataclass(frozen=True)
class PackedVocabMask:
    """One step's grammar mask: ``bitmask`` int32 [batch, ceil(vocab_size / 32)] (bit ``t % 32``
    of word ``t // 32`` set = token t allowed), meaningful only on ``rows`` (the requests with a
    grammar; the other rows are never read). Ids >= ``vocab_size`` are disallowed on ``rows``."""

    bitmask: torch.Tensor
    rows: tuple[int, ...]
    vocab_size: int

    def __post_init__(self) -> None:
        b = self.bitmask
        if b.dtype != torch.int32 or b.dim() != 2:
            raise ValueError(f"bitmask must be a 2-D int32 tensor, got {b.dtype} {tuple(b.shape)}.")
        if b.shape[1] != bitmask_words(self.vocab_size):
            raise ValueError(
                f"bitmask has {b.shape[1]} words per row; vocab_size {self.vocab_size} needs "
                f"{bitmask_words(self.vocab_size)}."
            )
        if not self.rows:
            raise ValueError("rows must name at least one constrained row.")
        ordered = list(self.rows) == sorted(set(self.rows))
        if not ordered or self.rows[0] < 0 or self.rows[-1] >= len(b):
            raise ValueError(f"rows must be distinct, sorted and in [0, {len(b)}): {self.rows}.")

    def apply_(self, logits: torch.Tensor) -> torch.Tensor:
        """Mask ``logits`` [batch, width] in place (see ``apply_token_bitmask_inplace``)."""
        return apply_token_bitmask_inplace(logits, self.bitmask, self.rows, self.vocab_size)


def apply_token_bitmask_inplace(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    rows: Sequence[int],
    vocab_size: int,
    *,
    kernel: Kernel | None = None,
) -> torch.Tensor:
    """Set ``logits[r, t]`` to -inf for each r in ``rows`` where bit t of ``bitmask[r]`` is clear
    or ``t >= vocab_size`` (the logits may be wider than the grammar's vocabulary: padding ids
    stay disallowed). Other rows are untouched. Returns ``logits``. The bits of ``bitmask`` past
    the masked width may be overwritten (they mean nothing).

    ``kernel`` overrides the automatic choice (tests compare them)."""
    if logits.dim() != 2 or len(logits) != len(bitmask):
        raise ValueError(
            f"logits {tuple(logits.shape)} and bitmask {tuple(bitmask.shape)} need the same rows."
        )
    rows = list(rows)
    if not rows:
        return logits
    # Bits past vocab_size (the last word's tail) mean nothing; ids past the mask are blocked.
    covered = min(logits.shape[1], vocab_size, bitmask.shape[1] * 32)
    if kernel is None:
        kernel = _default_kernel(logits, bitmask)
    if bitmask.device != logits.device:
        bitmask = bitmask.to(logits.device, non_blocking=True)
    kernel(logits, bitmask, covered, rows)
    if covered < logits.shape[1]:
        logits[rows, covered:] = float("-inf")
    return logits


def _default_kernel(logits: torch.Tensor, bitmask: torch.Tensor) -> Kernel:
    native = xgrammar_kernel()
    usable = (
        native is not None
        and logits.device.type == "cpu"
        and bitmask.device.type == "cpu"
        and logits.dtype in (torch.float32, torch.bfloat16, torch.float16)
        and logits.stride(-1) == 1
        and bitmask.stride(-1) == 1
    )
    return native if usable else torch_kernel  # type: ignore[return-value]


@functools.cache
def xgrammar_kernel() -> Kernel | None:
    """xgrammar's C++ CPU kernel, or None when xgrammar is not installed."""
    try:
        from xgrammar.kernels.apply_token_bitmask_inplace_cpu import (
            apply_token_bitmask_inplace_cpu,
        )
    except ImportError:
        return None

    def run(logits: torch.Tensor, bitmask: torch.Tensor, vocab_size: int, rows: list[int]) -> None:
        tail = vocab_size % 32
        if tail:
            # The kernel (xgrammar 0.2.9) also writes -inf at a clear bit just past vocab_size in
            # the last word, i.e. into the next row or past the tensor when the logits are
            # exactly vocab_size wide. Those bits mean nothing, so set them: no clear bit there.
            bitmask[:, vocab_size // 32].bitwise_or_(-(1 << tail))
        # indices=None lets the kernel walk every row without the index list.
        indices = None if len(rows) == len(logits) else rows
        apply_token_bitmask_inplace_cpu(logits, bitmask, vocab_size, indices)

    return run


# Bit j of a byte, as uint8 (for the torch kernel's one-byte-per-token unpacking).
_BYTE_BITS = torch.tensor([1 << j for j in range(8)], dtype=torch.uint8)
_WORD_SHIFTS = torch.arange(32, dtype=torch.int32)


def torch_kernel(
    logits: torch.Tensor, bitmask: torch.Tensor, vocab_size: int, rows: list[int]
) -> None:
    """The pure-torch kernel: unpack only ``rows``, then masked_fill_ them in place."""
    picked = bitmask[rows].contiguous()  # [R, words], a copy
    if sys.byteorder == "little":
        # Byte k of a little-endian row holds tokens 8k..8k+7 (bit j = token 8k+j), so the
        # unpacked mask costs one byte per token instead of an int32 per token.
        as_bytes = picked.view(torch.uint8)
        bits = as_bytes.unsqueeze(-1) & _BYTE_BITS.to(picked.device)
    else:
        bits = (picked.unsqueeze(-1) >> _WORD_SHIFTS.to(picked.device)) & 1
    blocked = (bits == 0).flatten(1)[:, :vocab_size]
    if len(rows) == len(logits):
        logits[:, :vocab_size].masked_fill_(blocked, float("-inf"))
        return
    for j, row in enumerate(rows):
        logits[row, :vocab_size].masked_fill_(blocked[j], float("-inf"))
