"""StepBuilder: the one way a step's inputs are flattened, one request's extend at a time.

Every caller (the serving step, whose requests with drafts add their trees through
verify_inputs.py, the EAGLE and draft-model drafters, bench_one_batch) adds (table row, tokens already in the KV, new tokens, their positions and
slots, which rows' logits it wants) and builds a StepInputs. Slots are either handed in (a
drafter's scratch slots) or, when left out, read for every token at once from the page table
at build time: one gather for the whole batch instead of a read, clone and cat per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from radixserve.model_executor.step_io import StepInputs

# Which of an extend's rows need logits: its last token's (it samples), all of them (prompt
# logprobs, verification), or none (a prefill chunk that stops short of the prompt's end).
LogitsWanted = Literal["last", "all", "none"]


@dataclass
class StepBuilder:
    with_lora: bool = False
    input_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    prefix_lens: list[int] = field(default_factory=list)
    extend_lens: list[int] = field(default_factory=list)
    lora_ids: list[int] = field(default_factory=list)
    logits_rows: list[int] = field(default_factory=list)
    hidden_rows: list[int] = field(default_factory=list)
    # Handed-in slots in order: tensors, and runs of plain ints kept as lists.
    _slot_parts: list[torch.Tensor | list[int]] = field(default_factory=list)
    _gathered: bool | None = None  # slots from the page table (True) or handed in (False)
    # M-RoPE extends: (first flattened row, their [3][n] positions); the other extends' tokens
    # take their 1-D position on all three axes. Empty: the step has 1-D positions only.
    _mrope_parts: list[tuple[int, Sequence[Sequence[int]]]] = field(default_factory=list)

    def add(
        self,
        row: int,
        prefix: int,
        input_ids: Sequence[int],
        *,
        positions: Sequence[int] | None = None,
        slots: torch.Tensor | Sequence[int] | None = None,
        lora_id: int = 0,
        logits: LogitsWanted = "last",
        mrope_positions: Sequence[Sequence[int]] | None = None,
    ) -> int:
        """One extend of `len(input_ids)` tokens on table row `row` after `prefix` tokens in
        the KV; positions default to prefix, prefix + 1, ... (they also pick the KV slots).
        `mrope_positions` ([3][n]: temporal, height, width) are an M-RoPE model's rotary
        positions for the tokens. Returns the flattened index of its first token."""
        start = len(self.input_ids)
        n = len(input_ids)
        if positions is None:
            positions = range(prefix, prefix + n)
        if len(positions) != n:
            raise ValueError(f"{n} tokens with {len(positions)} positions")
        gathered = slots is None
        if self._gathered is not None and gathered != self._gathered:
            raise ValueError("a step's slots are either all handed in or all read from the table")
        if mrope_positions is not None:
            if len(mrope_positions) != 3 or any(len(a) != n for a in mrope_positions):
                raise ValueError(f"{n} tokens need M-RoPE positions [3][{n}]")
            self._mrope_parts.append((start, mrope_positions))
        if slots is not None:
            self._add_slots(slots, n)
        self._gathered = gathered
        self.input_ids.extend(input_ids)
        self.positions.extend(positions)
        self.rows.append(row)
        self.prefix_lens.append(prefix)
        self.extend_lens.append(n)
        self.lora_ids.append(lora_id)
        if logits == "all":
            self.logits_rows.extend(range(start, start + n))
        elif logits == "last" and n:
            self.logits_rows.append(start + n - 1)
        return start

    def add_decode(
        self, rows: list[int], prefixes: list[int], tokens: list[int], lora_ids: list[int]
    ) -> None:
        """One token each for a batch of requests, slots from the table, each wanting its
        logits (a decode round): what add(row, prefix, [token], lora_id=..., logits="last")
        per request gives, extending each list once instead of ~20 calls a request."""
        if not len(rows) == len(prefixes) == len(tokens) == len(lora_ids):
            raise ValueError("rows, prefixes, tokens and lora_ids must be of one length")
        if self._gathered is False:
            raise ValueError("a step's slots are either all handed in or all read from the table")
        if not rows:
            return
        start = len(self.input_ids)
        self._gathered = True
        self.input_ids.extend(tokens)
        self.positions.extend(prefixes)
        self.rows.extend(rows)
        self.prefix_lens.extend(prefixes)
        self.extend_lens.extend([1] * len(rows))
        self.lora_ids.extend(lora_ids)
        self.logits_rows.extend(range(start, start + len(rows)))

    def _add_slots(self, slots: torch.Tensor | Sequence[int], n: int) -> None:
        if len(slots) != n:
            raise ValueError(f"{n} tokens with {len(slots)} slots")
        if isinstance(slots, torch.Tensor):
            self._slot_parts.append(slots.reshape(-1).to(torch.int64))
        elif self._slot_parts and isinstance(self._slot_parts[-1], list):
            self._slot_parts[-1].extend(slots)  # one tensor per run of plain ints, at build
        else:
            self._slot_parts.append(list(slots))

    def want_hidden(self, token_row: int) -> int:
        """Ask for the final hidden state of flattened token `token_row`; returns its index
        among the step's hidden rows."""
        self.hidden_rows.append(token_row)
        return len(self.hidden_rows) - 1

    def build(
        self,
        *,
        slot_table: torch.Tensor | None = None,
        is_decode: bool | None = None,
        spec_hidden: torch.Tensor | None = None,
        capture_routing: bool = False,
        image_chunks: tuple[Any, ...] = (),
        argmax_only: bool = False,
    ) -> StepInputs:
        """The step. `slot_table` ([rows, context] slot ids) is needed when slots were left
        out. `is_decode` defaults to "every extend is one token"; a caller whose one-token
        extends must not run as a decode step (a per-round table the compiled decode graph was
        not built for) passes False."""
        if self._gathered is False or not self.input_ids:
            parts = [
                torch.tensor(p, dtype=torch.int64) if isinstance(p, list) else p
                for p in self._slot_parts
            ]
            # cat copies, so later table writes do not change the step's slots.
            out_cache_loc = torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)
        else:
            if slot_table is None:
                raise ValueError("slots were left out: build needs the page table to read them")
            out_cache_loc = _gather_slots(slot_table, self.rows, self.extend_lens, self.positions)
        if is_decode is None:
            is_decode = all(n == 1 for n in self.extend_lens)
        return StepInputs(
            is_decode=is_decode,
            input_ids=self.input_ids,
            positions=self.positions,
            req_pool_indices=self.rows,
            prefix_lens=self.prefix_lens,
            extend_lens=self.extend_lens,
            out_cache_loc=out_cache_loc,
            logits_rows=self.logits_rows,
            hidden_rows=tuple(self.hidden_rows),
            lora_ids=tuple(self.lora_ids) if self.with_lora else (),
            spec_hidden=spec_hidden,
            capture_routing=capture_routing,
            image_chunks=image_chunks,
            mrope_positions=self._mrope(),
            argmax_only=argmax_only,
        )

    def _mrope(self) -> torch.Tensor | None:
        """[3, tokens] rotary positions when some extend has M-RoPE positions, else None."""
        if not self._mrope_parts:
            return None
        out = torch.tensor(self.positions, dtype=torch.int64).repeat(3, 1)
        for start, axes in self._mrope_parts:
            out[:, start : start + len(axes[0])] = torch.tensor(axes, dtype=torch.int64)
        return out


def _gather_slots(
    table: torch.Tensor, rows: Sequence[int], extend_lens: Sequence[int], positions: list[int]
) -> torch.Tensor:
    """table[row of token i, positions[i]] for every token, as a fresh 1-D int64 tensor on the
    table's device (advanced indexing copies, so later table writes do not change it)."""
    one_each = all(n == 1 for n in extend_lens)  # a decode step: one row per token
    if one_each and table.device.type == "cpu":
        # numpy indexing, no torch call (each re-takes the GIL).
        picked = table.numpy()[np.asarray(rows, dtype=np.int64), np.asarray(positions, np.int64)]
        return torch.from_numpy(picked)
    if one_each:
        token_rows = torch.tensor(rows, dtype=torch.int64, device=table.device)
    else:
        token_rows = torch.repeat_interleave(
            torch.tensor(rows, dtype=torch.int64), torch.tensor(extend_lens, dtype=torch.int64)
        ).to(table.device)
    idx_pos = torch.tensor(positions, dtype=torch.int64, device=table.device)
    return table[token_rows, idx_pos]


def paths_table(
    req_to_token: torch.Tensor, rows: Sequence[tuple[int, int, Sequence[int]]]
) -> torch.Tensor:
    """A request-to-token table for rows that attend to part of a request's context and then
    to slots of their own: per row (pool row, context length, tail), the pool row's first
    `context length` slots followed by the tail (a draft chain's ancestors and own slots, or a
    draft model's path of scratch slots)."""
    width = max(context + len(tail) for _, context, tail in rows)
    table = torch.zeros((len(rows), width), dtype=req_to_token.dtype)
    for r, (pool_row, context, tail) in enumerate(rows):
        table[r, :context] = req_to_token[pool_row, :context]
        table[r, context : context + len(tail)] = torch.tensor(tail, dtype=table.dtype)
    return table
