"""A draft tree's rows in a step (model_executor/verify_inputs.py): every node's token,
position, slot and logits row, for chains on the requests' own table rows and for trees cut
into chains on a table built for the step; the step's other requests run as they would
without drafts."""

from __future__ import annotations

import torch

from radixserve.model_executor.step_builder import StepBuilder
from radixserve.model_executor.verify_inputs import RoundTable, add_tree
from radixserve.speculative.draft_tree import DraftTree


def _table() -> torch.Tensor:
    # Row r, position p holds slot 100 * r + p.
    return torch.arange(4).view(-1, 1) * 100 + torch.arange(16).view(1, -1)


def test_chains_run_on_their_own_rows() -> None:
    req_to_token = _table()
    trees = [DraftTree.chain([8, 9]), DraftTree()]
    table = RoundTable(req_to_token, trees)
    b = StepBuilder(with_lora=True)
    nodes = add_tree(b, table, pool_row=1, kv_len=5, root_token=7, tree=trees[0], lora_id=3)
    b.add(table.row(2, 4), 3, [4])  # a request without drafts: its last token
    assert table.build() is req_to_token
    step = b.build(slot_table=table.build())
    assert step.input_ids == [7, 8, 9, 4]
    assert step.positions == [5, 6, 7, 3]
    assert step.req_pool_indices == [1, 2]
    assert step.prefix_lens == [5, 3]
    assert step.extend_lens == [3, 1]
    assert step.out_cache_loc.tolist() == [105, 106, 107, 203]
    assert step.logits_rows == [0, 1, 2, 3]  # every node's logits
    assert step.lora_ids == (3, 0)
    assert nodes.rows == [0, 1, 2]
    assert nodes.slots == [105, 106, 107]


def test_a_branching_tree_attends_to_its_ancestors_only() -> None:
    # Root 0 -> 1 -> 2, and 0 -> 3 (a second branch at the root), then 3 -> 4.
    tree = DraftTree(tokens=(21, 22, 23, 24), parents=(0, 1, 0, 3))
    table = RoundTable(_table(), [tree, DraftTree()])
    b = StepBuilder()
    nodes = add_tree(b, table, pool_row=1, kv_len=2, root_token=20, tree=tree)
    b.add(table.row(3, 2), 1, [30])
    rows = table.build()
    step = b.build(slot_table=rows)
    # Chains: [0, 1, 2], [3, 4], then the other request's token.
    assert step.input_ids == [20, 21, 22, 23, 24, 30]
    assert step.positions == [2, 3, 4, 3, 4, 1]  # kv_len + depth
    assert step.prefix_lens == [2, 3, 1]
    assert step.extend_lens == [3, 2, 1]
    # Node i's KV lives at the request's position kv_len + i.
    assert step.out_cache_loc.tolist() == [102, 103, 104, 105, 106, 301]
    assert nodes.rows == [0, 1, 2, 3, 4]
    assert nodes.slots == [102, 103, 104, 105, 106]
    # One table row per extend: the context's slots, the chain's ancestors' slots, its own.
    assert step.req_pool_indices == [0, 1, 2]
    assert rows[0, :5].tolist() == [100, 101, 102, 103, 104]
    assert rows[1, :5].tolist() == [100, 101, 102, 105, 106]  # root, then 3 and 4
    assert rows[2, :2].tolist() == [300, 301]


def test_without_trees_the_step_runs_on_the_pool_table() -> None:
    req_to_token = _table()
    for trees in (None, [DraftTree(), DraftTree.chain([5])]):
        table = RoundTable(req_to_token, trees)
        assert not table.branching
        assert table.row(2, 7) == 2
        assert table.build() is req_to_token
