"""Apply a batch's packed grammar bitmask to its logits in place.

The scheduler fills one int32 row per constrained request (``GrammarMatcher.fill_packed``) and
hands the sampler a ``PackedVocabMask``; the sampler sets the disallowed logits of those rows to
-inf here, each row the cheaper of two ways (``split_kernel``): a row that allows few tokens is
filled with -inf and its allowed logits put back (``sparse_kernel``); the others go to
xgrammar's own CPU kernel when xgrammar is installed, else (or on another device) a torch
version that unpacks only those rows, one byte per token. No [batch, vocab] int32 or bool mask
is built for the whole batch.

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
    dense: Kernel = native if usable else torch_kernel  # type: ignore[assignment]
    return functools.partial(split_kernel, dense=dense)


def split_kernel(
    logits: torch.Tensor, bitmask: torch.Tensor, vocab_size: int, rows: list[int], dense: Kernel
) -> None:
    """Each row the cheaper way. xgrammar's kernel costs a bit scan and a store per disallowed
    token (~0.3 ms per 49k-token row that allows a handful), while most steps of a JSON grammar
    allow either a handful of tokens or nearly all; rows whose allowed tokens sit in under half
    of the words go to ``sparse_kernel`` (fill, then put the allowed logits back)."""
    full = vocab_size // 32
    live = (bitmask[rows, :full] != 0).sum(dim=1).tolist() if full else [0] * len(rows)
    sparse = [r for r, n in zip(rows, live, strict=True) if 2 * n < full]
    if len(sparse) < len(rows):
        chosen = set(sparse)
        dense(logits, bitmask, vocab_size, [r for r in rows if r not in chosen])
    if sparse:
        sparse_kernel(logits, bitmask, vocab_size, sparse)


def sparse_kernel(
    logits: torch.Tensor, bitmask: torch.Tensor, vocab_size: int, rows: list[int]
) -> None:
    """Save the logits of the words holding an allowed token, fill each row's first
    ``vocab_size`` logits with -inf (memset speed), and write the saved words back with their
    disallowed tokens at -inf: work in proportion to the allowed words, not the vocabulary."""
    full, tail = divmod(vocab_size, 32)
    shifts = _WORD_SHIFTS.to(logits.device)
    index = torch.tensor(rows, device=logits.device)
    words = bitmask.index_select(0, index)[:, :full]
    hit = words.nonzero()  # (position in rows, word) of every word with an allowed token
    # One flat index per hit word into a [batch * full, 32] view: index_select / index_copy_
    # are a few times cheaper than two-tensor advanced indexing.
    flat: torch.Tensor | None = None
    if logits.is_contiguous() and logits.shape[1] == full * 32:
        flat = index[hit[:, 0]] * full + hit[:, 1]
        by_word = logits.view(len(logits) * full, 32)
    else:  # wider rows (padding, a partial word): no flat view of whole words
        by_word = logits[:, : full * 32].view(len(logits), full, 32)
    hit_bits = words[hit[:, 0], hit[:, 1]]
    if flat is not None:
        kept = by_word.index_select(0, flat)  # a copy: [K, 32]
    else:
        kept = by_word[index[hit[:, 0]], hit[:, 1]]
    kept.masked_fill_(((hit_bits.unsqueeze(-1) >> shifts) & 1) == 0, _NEG_INF)
    if tail:  # the last, partial word, unpacked directly (at most 31 tokens a row)
        tail_kept = logits[index, full * 32 : vocab_size]
        tail_bits = (bitmask[index, full].unsqueeze(-1) >> shifts[:tail]) & 1
        tail_kept.masked_fill_(tail_bits == 0, _NEG_INF)
    for row in rows:
        logits[row, :vocab_size].fill_(_NEG_INF)
    if flat is not None:
        by_word.index_copy_(0, flat, kept)
    else:
        by_word[index[hit[:, 0]], hit[:, 1]] = kept
    if tail:
        logits[index, full * 32 : vocab_size] = tail_kept


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
_NEG_INF = float("-inf")


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
