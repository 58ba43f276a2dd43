"""A speculative round's inputs (model_executor/verify_inputs.py): every node's token, position,
slot and logits row, for chains on the requests' own table rows and for trees cut into chains
on a table built for the round; a request without drafts runs as plain decoding would."""

from __future__ import annotations

import torch

from radixserve.model_executor.verify_inputs import TreeExtend, build_verify_inputs
from radixserve.speculative.draft_tree import DraftTree


def _table() -> torch.Tensor:
    # Row r, position p holds slot 100 * r + p.
    return torch.arange(4).view(-1, 1) * 100 + torch.arange(16).view(1, -1)


def test_chains_run_on_their_own_rows() -> None:
    table = _table()
    verify = build_verify_inputs(
        [
            TreeExtend(row=1, kv_len=5, root_token=7, tree=DraftTree.chain([8, 9]), lora_id=3),
            TreeExtend(row=2, kv_len=3, root_token=4, tree=DraftTree()),
        ],
        table,
        with_lora=True,
    )
    step = verify.step
    assert verify.table is table
    assert step.input_ids == [7, 8, 9, 4]
    assert step.positions == [5, 6, 7, 3]
    assert step.req_pool_indices == [1, 2]
    assert step.prefix_lens == [5, 3]
    assert step.extend_lens == [3, 1]
    assert step.out_cache_loc.tolist() == [105, 106, 107, 203]
    assert step.logits_rows == [0, 1, 2, 3]  # every node's logits
    assert step.lora_ids == (3, 0)
    assert step.is_decode is False
    assert verify.node_rows == [[0, 1, 2], [3]]
    assert verify.node_slots == [[105, 106, 107], [203]]


def test_a_request_without_drafts_alone_is_a_decode_step() -> None:
    verify = build_verify_inputs([TreeExtend(0, 4, 11, DraftTree())], _table(), with_lora=False)
    assert verify.step.is_decode is True
    assert verify.step.input_ids == [11]
    assert verify.step.positions == [4]
    assert verify.step.lora_ids == ()


def test_a_branching_tree_attends_to_its_ancestors_only() -> None:
    # Root 0 -> 1 -> 2, and 0 -> 3 (a second branch at the root), then 3 -> 4.
    tree = DraftTree(tokens=(21, 22, 23, 24), parents=(0, 1, 0, 3))
    table = _table()
    verify = build_verify_inputs(
        [TreeExtend(1, 2, 20, tree), TreeExtend(3, 1, 30, DraftTree())], table, with_lora=False
    )
    step = verify.step
    # Chains: [0, 1, 2], [3, 4], then the plain request's [0].
    assert step.input_ids == [20, 21, 22, 23, 24, 30]
    assert step.positions == [2, 3, 4, 3, 4, 1]  # kv_len + depth
    assert step.prefix_lens == [2, 3, 1]
    assert step.extend_lens == [3, 2, 1]
    # Node i's KV lives at the request's position kv_len + i.
    assert step.out_cache_loc.tolist() == [102, 103, 104, 105, 106, 301]
    assert verify.node_rows == [[0, 1, 2, 3, 4], [5]]
    # One table row per chain: the context's slots, the chain's ancestors' slots, its own.
    assert step.req_pool_indices == [0, 1, 2]
    rows = verify.table
    assert rows[0, :5].tolist() == [100, 101, 102, 103, 104]
    assert rows[1, :5].tolist() == [100, 101, 102, 105, 106]  # root, then 3 and 4
    assert rows[2, :2].tolist() == [300, 301]
    # Each token's slot is where its row's table puts its position.
    for token, (row, pos) in enumerate(zip([0, 0, 0, 1, 1, 2], step.positions, strict=True)):
        assert rows[row, pos].item() == step.out_cache_loc[token].item()
