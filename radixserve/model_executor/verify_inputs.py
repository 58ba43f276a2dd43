"""A draft tree's rows in a step: how the step builder lays out a request that carries drafts.

A request with drafts runs [last, d_1..d_n], the root and the nodes of its draft tree
(speculative/draft_tree.py): node i's KV goes to the slot at the request's position kv_len + i
(allocated by the batch former) and its RoPE position is kv_len + depth(i); every node wants
logits. A chain is one extend on the request's own table row. When some tree of the step
branches, every tree is cut into chains, each an extend on a row of a small table built for
the step (`RoundTable`, `paths_table`: the context's slots, then the chain's ancestors' slots,
then its own), so a node attends to the cached context and its own ancestors only; the step's
other requests get a row of that table too (their context and new tokens' slots). Slots are
read from whichever table the step runs on, in StepBuilder's one gather.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixserve.model_executor.step_builder import StepBuilder, paths_table

if TYPE_CHECKING:
    from radixserve.speculative.draft_tree import DraftTree


class RoundTable:
    """The table a step runs on: the request-to-token table itself, or, when some draft tree
    of the step branches, one row per extend built for the step."""

    def __init__(self, req_to_token: torch.Tensor, trees: Sequence[DraftTree] | None) -> None:
        self.req_to_token = req_to_token
        self.branching = trees is not None and any(not tree.is_chain for tree in trees)
        self._rows: list[tuple[int, int, list[int]]] = []  # (pool row, context len, tail)

    def row(self, pool_row: int, context: int, tail: Sequence[int] = ()) -> int:
        """The table row of an extend that attends to the pool row's first `context` slots,
        then to `tail` (a chain's ancestors' and own slots)."""
        if not self.branching:
            return pool_row
        self._rows.append((pool_row, context, list(tail)))
        return len(self._rows) - 1

    def build(self) -> torch.Tensor:
        if not self.branching or not self._rows:
            return self.req_to_token
        return paths_table(self.req_to_token, self._rows)


@dataclass(frozen=True)
class TreeNodes:
    """Where a request's tree went in the step: each node's flattened row (its logits row:
    every node wants logits) and its KV slot (node 0: the last verified token)."""

    rows: list[int]
    slots: list[int]


def add_tree(
    step: StepBuilder,
    table: RoundTable,
    pool_row: int,
    kv_len: int,
    root_token: int,
    tree: DraftTree,
    lora_id: int = 0,
) -> TreeNodes:
    """Add one request's tree to the step: one extend per chain (one in all when no tree of
    the step branches, on the request's own table row)."""
    tokens = [root_token, *tree.tokens]
    slots = table.req_to_token[pool_row, kv_len : kv_len + len(tokens)].tolist()
    rows = [0] * len(tokens)
    for chain in tree.chains() if table.branching else [list(range(len(tokens)))]:
        first = chain[0]
        ancestors = [0, *tree.path(tree.parents[first - 1])] if first else []
        row = table.row(pool_row, kv_len, [slots[n] for n in ancestors + chain])
        for k, node in enumerate(chain):
            rows[node] = len(step.input_ids) + k
        step.add(
            row,
            prefix=kv_len + tree.depths[first],
            input_ids=[tokens[n] for n in chain],
            positions=[kv_len + tree.depths[n] for n in chain],
            lora_id=lora_id,
            logits="all",
        )
    return TreeNodes(rows, slots)
