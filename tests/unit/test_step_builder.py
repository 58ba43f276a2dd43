"""StepBuilder: every caller's step is flattened by it, so its rows, slots and logits rows are
checked here once."""

from __future__ import annotations

import pytest
import torch

from radixserve.model_executor.step_builder import StepBuilder


def _table() -> torch.Tensor:
    # Row r, position p holds slot 100 * r + p.
    return torch.arange(4).view(-1, 1) * 100 + torch.arange(16).view(1, -1)


def test_slots_are_gathered_from_the_table_at_build() -> None:
    b = StepBuilder()
    assert b.add(2, 3, [7, 8, 9]) == 0
    assert b.add(1, 5, [4], logits="none") == 3
    assert b.add(3, 0, [1, 2], logits="all") == 4
    table = _table()
    step = b.build(slot_table=table)
    assert step.out_cache_loc.tolist() == [203, 204, 205, 105, 300, 301]
    assert step.positions == [3, 4, 5, 5, 0, 1]
    assert step.req_pool_indices == [2, 1, 3]
    assert step.prefix_lens == [3, 5, 0]
    assert step.extend_lens == [3, 1, 2]
    assert step.logits_rows == [2, 4, 5]
    assert step.is_decode is False
    assert step.lora_ids == ()
    table[2, 3] = -1  # the step keeps its own copy
    assert step.out_cache_loc[0].item() == 203


def test_handed_in_slots_keep_their_order_across_lists_and_tensors() -> None:
    b = StepBuilder(with_lora=True)
    b.add(0, 4, [1], positions=[9], slots=[11], lora_id=2)
    b.add(1, 4, [2], slots=torch.tensor([12]))
    b.add(2, 4, [3], slots=[13])
    step = b.build()
    assert step.out_cache_loc.tolist() == [11, 12, 13]
    assert step.positions == [9, 4, 4]
    assert step.is_decode is True
    assert step.lora_ids == (2, 0, 0)
    assert b.build(is_decode=False).is_decode is False


def test_hidden_rows_and_step_extras() -> None:
    b = StepBuilder()
    b.add(0, 0, [1, 2, 3], logits="none")
    assert b.want_hidden(2) == 0
    features = torch.zeros(3, 4)
    step = b.build(slot_table=_table(), spec_hidden=features, capture_routing=True)
    assert step.hidden_rows == (2,)
    assert step.logits_rows == []
    assert step.spec_hidden is features
    assert step.capture_routing is True


def test_mistakes_are_refused() -> None:
    b = StepBuilder()
    with pytest.raises(ValueError, match="positions"):
        b.add(0, 0, [1, 2], positions=[0])
    with pytest.raises(ValueError, match="slots"):
        b.add(0, 0, [1, 2], slots=[5])
    b.add(0, 0, [1])
    with pytest.raises(ValueError, match="all handed in or all read"):
        b.add(1, 0, [1], slots=[3])
    with pytest.raises(ValueError, match="page table"):
        b.build()


def test_a_decode_step_gathers_one_slot_per_request() -> None:
    b = StepBuilder()
    for row, prefix in ((3, 7), (0, 2), (2, 5)):
        b.add(row, prefix, [1])
    step = b.build(slot_table=_table())
    assert step.out_cache_loc.tolist() == [307, 2, 205]
    assert step.is_decode is True


def test_a_decode_batch_added_at_once_equals_adding_each_request() -> None:
    """add_decode (the serving step's decode rounds) builds the same step as one add per
    request; its slots are gathered (numpy-indexed on a CPU table) into the step's own copy."""
    rows, prefixes, tokens, loras = [2, 0, 3], [5, 9, 1], [70, 71, 72], [0, 1, 0]
    one_by_one = StepBuilder(with_lora=True)
    for row, prefix, token, lora in zip(rows, prefixes, tokens, loras, strict=True):
        one_by_one.add(row, prefix, [token], lora_id=lora)
    at_once = StepBuilder(with_lora=True)
    at_once.add_decode(rows, prefixes, tokens, loras)
    table = _table()
    want, got = one_by_one.build(slot_table=table), at_once.build(slot_table=table)
    assert torch.equal(got.out_cache_loc, want.out_cache_loc)
    assert got.out_cache_loc.tolist() == [205, 9, 301]
    assert got._replace(out_cache_loc=None) == want._replace(out_cache_loc=None)
    assert got.is_decode and got.logits_rows == [0, 1, 2]
    table[2, 5] = -1  # the step keeps its own copy
    assert got.out_cache_loc[0].item() == 205
    with pytest.raises(ValueError, match="one length"):
        StepBuilder().add_decode([1], [2, 3], [4], [0])
    mixed = StepBuilder()
    mixed.add(0, 0, [1], slots=[5])
    with pytest.raises(ValueError, match="all handed in or all read"):
        mixed.add_decode([1], [2], [3], [0])
