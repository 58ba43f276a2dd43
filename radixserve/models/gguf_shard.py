"""--quantization gguf with --tp-size > 1: each rank keeps its slice of a file's blocks.

A GGUF row is a run of whole blocks of one output feature, so a column-parallel layer's slice
(its rows of q, k, v, gate, up) is a slice of whole rows, cut where the float loader cuts
(LinearBase.output_shard). A row-parallel layer (o, down) splits the input dimension: its slice
is a run of whole blocks inside every row, which needs the rank's first column and width to
fall on block boundaries (32 weights, 256 for K-quants); a split that does not is refused with
the sizes that would work. The embedding (and an untied LM head) keep their vocabulary rows,
padded with zero blocks (which decode to zero in every format) to the rank's partition; the
experts of a MoE layer keep the rank's slice of every expert's intermediate size (within its
--ep-size group, which keeps whole experts). The result is the rank's own copy: nothing of the
whole tensor stays alive.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from radixserve.layers.gguf_formats import FORMATS, type_name, whole_blocks
from radixserve.layers.moe import ExpertBlocks

Parts = list[tuple[torch.Tensor, int]]
_CONTIGUOUS = torch.contiguous_format


def shard_linear_blocks(module: nn.Module, parts: Parts, part_rows: Sequence[int]) -> Parts:
    """This rank's blocks of a linear layer given part by part ([rows, row bytes] each, or the
    parts of one type joined, with `part_rows` the rows of each part)."""
    output_shard = getattr(module, "output_shard", None)
    input_shard = getattr(module, "input_shard", None)
    if getattr(module, "tp_size", 1) == 1 or (output_shard is None and input_shard is None):
        return parts
    pieces = _per_part(parts, part_rows)
    shard_ids = getattr(module.weight, "shard_ids", None) or (None,) * len(pieces)
    out = []
    for (blocks, qtype), shard_id in zip(pieces, shard_ids, strict=True):
        if output_shard is not None:
            start, rows = output_shard(shard_id)
            blocks = blocks.narrow(0, start, rows)
        if input_shard is not None:
            start, width = input_shard()
            blocks = _input_columns(blocks, qtype, start, width, dim=1)
        out.append((blocks.clone(memory_format=_CONTIGUOUS), qtype))
    return out


def shard_vocab_blocks(module: nn.Module, blocks: torch.Tensor) -> torch.Tensor:
    """A VocabParallelEmbedding's (or LM head's) rows of the vocabulary's blocks, zero-padded
    to its partition."""
    if getattr(module, "tp_size", 1) == 1:
        return blocks
    owned = blocks[module.vocab_start : module.vocab_end]
    out = torch.zeros(module.rows_per_partition, blocks.shape[1], dtype=blocks.dtype)
    out[: owned.shape[0]] = owned
    return out


def shard_expert_blocks(
    layer: nn.Module, gate_up: list[ExpertBlocks], down: ExpertBlocks
) -> tuple[list[ExpertBlocks], ExpertBlocks]:
    """A FusedMoE's slice of each expert's gate and up rows and down columns, where its ranks
    split the experts' intermediate size (--tp-size above --ep-size)."""
    if getattr(layer, "moe_tp_size", 1) == 1:
        return gate_up, down
    inter = layer.intermediate_size
    start = layer.moe_tp_rank * inter
    total = sum(p.rows for p in gate_up)
    if len(gate_up) != 2 or gate_up[0].rows != gate_up[1].rows:
        raise ValueError(f"GGUF experts: expected separate gate and up stacks, got {total} rows")
    sliced = [
        ExpertBlocks(
            p.blocks.narrow(1, start, inter).clone(memory_format=_CONTIGUOUS), p.qtype, inter
        )
        for p in gate_up
    ]
    columns = _input_columns(down.blocks, down.qtype, start, inter, dim=2)
    columns = columns.clone(memory_format=_CONTIGUOUS)
    return sliced, ExpertBlocks(columns, down.qtype, down.rows)


def _per_part(parts: Parts, part_rows: Sequence[int]) -> Parts:
    if len(parts) == len(part_rows):
        return parts
    if len(parts) != 1:
        raise ValueError(f"{len(parts)} block tensors for {len(part_rows)} parts")
    blocks, qtype = parts[0]
    return [(piece, qtype) for piece in blocks.split(list(part_rows))]


def _input_columns(
    blocks: torch.Tensor, qtype: int, start: int, width: int, dim: int
) -> torch.Tensor:
    """Input columns [start, start + width) of blocks whose rows run along `dim` in bytes."""
    fmt = FORMATS[qtype]
    if not whole_blocks(qtype, start, width):
        raise ValueError(
            f"--tp-size: a rank's slice of {width} input columns (from column {start}) does not "
            f"fall on {type_name(qtype)} block boundaries ({fmt.weights} weights a block); use a "
            "--tp-size that leaves each rank a multiple of that, or --quantization unquant"
        )
    return blocks.narrow(dim, start // fmt.weights * fmt.bytes, width // fmt.weights * fmt.bytes)
