"""Scheduler side: a prompt's M-RoPE positions (Qwen2-VL, Qwen2.5-VL), computed once per request
from its token layout and kept on the request.

Text tokens count up one by one on all three axes (temporal, height, width). An image's tokens
are its merged patch grid, row by row: they share the temporal position where the image starts,
and their height and width positions are that start plus their row and column. The text after an
image continues from one past the largest position the image used, so positions run behind
token indices by a per-request `delta` (<= 0); a token past the prompt (a generated one, or one
re-run after retraction) sits at its index + delta on all three axes, as in transformers'
generate. A cached prefix needs nothing of its own: its tokens' positions depend only on the
layout before them, which the cache key (image tokens keyed by content) fixes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GridSpan:
    """An image's tokens in the prompt: from `offset`, t x h x w of them (the merged grid)."""

    offset: int
    t: int
    h: int
    w: int

    @property
    def length(self) -> int:
        return self.t * self.h * self.w


@dataclass(frozen=True)
class MRopePositions:
    """positions [3, prompt length] int64, and delta: position - index past the prompt."""

    positions: torch.Tensor
    delta: int

    def take(self, first: int, count: int) -> list[list[int]]:
        """The [3][count] positions of tokens [first, first + count)."""
        prompt_len = int(self.positions.shape[1])
        inside = self.positions[:, first : min(first + count, prompt_len)].tolist()
        past = list(range(max(first, prompt_len) + self.delta, first + count + self.delta))
        return [axis + past for axis in inside]


def mrope_positions(length: int, spans: Sequence[GridSpan]) -> MRopePositions:
    """The M-RoPE positions of a `length`-token prompt whose images sit at `spans`."""
    out = torch.empty(3, length, dtype=torch.int64)
    index = 0  # next token
    position = 0  # next text position
    for span in sorted(spans, key=lambda s: s.offset):
        if span.offset < index or span.offset + span.length > length:
            raise ValueError(f"image span at {span.offset} overlaps another or the prompt's end")
        text = span.offset - index
        out[:, index : span.offset] = torch.arange(position, position + text)
        position += text
        t, h, w = torch.meshgrid(
            torch.arange(span.t), torch.arange(span.h), torch.arange(span.w), indexing="ij"
        )
        end = span.offset + span.length
        # An image is one temporal step (its frame repeated to the temporal patch size).
        out[0, span.offset : end] = t.flatten() + position
        out[1, span.offset : end] = h.flatten() + position
        out[2, span.offset : end] = w.flatten() + position
        position += max(span.t, span.h, span.w)
        index = end
    out[:, index:] = torch.arange(position, position + length - index)
    position += length - index
    return MRopePositions(out, position - length)
