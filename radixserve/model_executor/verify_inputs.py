"""A speculative round's model inputs, flattened by the same StepBuilder as every other step.

A request with drafts runs [last, d_1..d_n], the root and the nodes of its draft tree
(speculative/draft_tree.py): node i's KV goes to the slot at the request's position kv_len + i
(allocated by the batch former) and its RoPE position is kv_len + depth(i); every node wants
logits. A chain is one extend on the request's own table row. When some tree branches, every
request's tree is cut into chains, each an extend on a row of a small table built for the round
(`paths_table`: the context's slots, then the chain's ancestors' slots, then its own), so a node
attends to the cached context and its own ancestors only. A request without drafts is the
one-node tree: its last token, exactly as plain decoding runs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixserve.model_executor.step_builder import StepBuilder, paths_table
from radixserve.model_executor.step_io import StepInputs

if TYPE_CHECKING:
    from radixserve.speculative.draft_tree import DraftTree


@dataclass(frozen=True)
class TreeExtend:
    """One request of a round: its table row and cached length (kv_len), the last verified
    token (the tree's root, not in the KV yet), its drafts and its LoRA adapter."""

    row: int
    kv_len: int
    root_token: int
    tree: DraftTree
    lora_id: int = 0


@dataclass(frozen=True)
class VerifyInputs:
    """A verify forward: its step and table, and per request the logits row and KV slot of
    each tree node (node 0: the last verified token)."""

    step: StepInputs
    table: torch.Tensor
    node_rows: list[list[int]]
    node_slots: list[list[int]]


def build_verify_inputs(
    extends: Sequence[TreeExtend], req_to_token: torch.Tensor, *, with_lora: bool
) -> VerifyInputs:
    """Flatten the round: one extend per chain of each request's tree (one per request when
    no tree branches, on the request's own table row)."""
    branching = any(not e.tree.is_chain for e in extends)
    step = StepBuilder(with_lora=with_lora)
    node_rows: list[list[int]] = []
    node_slots: list[list[int]] = []
    table_rows: list[tuple[int, int, list[int]]] = []  # (pool row, context len, tail)
    for e in extends:
        tree = e.tree
        tokens = [e.root_token, *tree.tokens]
        slots = req_to_token[e.row, e.kv_len : e.kv_len + len(tokens)].tolist()
        rows = [0] * len(tokens)
        for chain in tree.chains() if branching else [list(range(len(tokens)))]:
            first = chain[0]
            ancestors = [0, *tree.path(tree.parents[first - 1])] if first else []
            if branching:
                table_rows.append((e.row, e.kv_len, [slots[n] for n in ancestors + chain]))
                row = len(table_rows) - 1
            else:
                row = e.row
            for k, node in enumerate(chain):
                rows[node] = len(step.input_ids) + k
            step.add(
                row,
                prefix=e.kv_len + tree.depths[first],
                input_ids=[tokens[n] for n in chain],
                positions=[e.kv_len + tree.depths[n] for n in chain],
                slots=[slots[n] for n in chain],
                lora_id=e.lora_id,
                logits="all",
            )
        node_rows.append(rows)
        node_slots.append(slots)
    table = paths_table(req_to_token, table_rows) if branching else req_to_token
    return VerifyInputs(step.build(), table, node_rows, node_slots)
