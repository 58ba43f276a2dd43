"""gpt-oss's MXFP4 expert stacks (quant_method "mxfp4" safetensors) -> FusedMoE on blocks.

Each projection's `*_blocks` / `*_scales` pair is repacked into ggml's block_mxfp4 rows
(layers/quantization/mxfp4.py repack_mxfp4: 17 bytes per 32 weights, the layout a GGUF file
stores and the C++ block kernels run), one expert at a time into one uint8 stack per
projection, and handed to the layer as a GGUF file's experts are (layers/moe/methods.py
use_gguf_experts; the same tensor-parallel slicing, models/gguf_shard.py). No expert is ever
decoded to float: gpt-oss-20b's experts take ~10 GB instead of ~38 GB in bfloat16.

gate_up's rows alternate gate, up in the checkpoint; whole rows of blocks are moved so the
stack has gate rows first, as FusedMoE expects (exact: a row's blocks are its own).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from radixserve.layers.gguf_formats import FORMATS, MXFP4, whole_blocks
from radixserve.layers.moe import ExpertBlocks, FusedMoE, use_gguf_experts
from radixserve.layers.quantization.mxfp4 import repack_mxfp4
from radixserve.models.gguf_shard import shard_expert_blocks

logger = logging.getLogger(__name__)


class MxFp4ExpertLoader:
    """The keep_blocks callback of gpt_oss_checkpoint.gpt_oss_tensors for one model: puts each
    MoE layer on MXFP4 blocks once both its projections have arrived."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        # experts prefix -> the projections repacked so far ("gate_up_proj", "down_proj").
        self._pending: dict[str, dict[str, torch.Tensor]] = {}
        self.layers_on_blocks = 0

    def __call__(self, prefix: str, proj: str, blocks: torch.Tensor, scales: torch.Tensor) -> bool:
        try:
            layer = self.model.get_submodule(prefix)
        except AttributeError:
            return True  # a layer another pipeline stage holds: nothing to load here
        if not isinstance(layer, FusedMoE) or not _fits(layer):
            return False  # decoded to float instead (gpt_oss_checkpoint)
        if blocks.dim() != 4 or blocks.shape[:3] != scales.shape:
            raise ValueError(
                f"{prefix}.{proj}_blocks {tuple(blocks.shape)} / _scales {tuple(scales.shape)}: "
                "expected [experts, out, G, 16] and [experts, out, G]"
            )
        parts = self._pending.setdefault(prefix, {})
        parts[proj] = repack_stack(blocks, scales, gate_up=proj == "gate_up_proj")
        if len(parts) < 2:
            return True
        del self._pending[prefix]
        joined, down_blocks = parts["gate_up_proj"], parts["down_proj"]
        inter = joined.shape[1] // 2
        down = ExpertBlocks(down_blocks, MXFP4, down_blocks.shape[1])
        if layer.moe_tp_size > 1:
            halves = [
                ExpertBlocks(joined.narrow(1, i * inter, inter), MXFP4, inter) for i in (0, 1)
            ]
            gate_up, down = shard_expert_blocks(layer, halves, down)
        else:  # one stack, gate rows first: nothing to join
            gate_up = [ExpertBlocks(joined, MXFP4, 2 * inter)]
        use_gguf_experts(layer, gate_up, down)
        self.layers_on_blocks += 1
        return True


def _fits(layer: FusedMoE) -> bool:
    """Whether this rank's slice of down's input columns is whole MXFP4 blocks (always at
    --tp-size 1; gpt-oss's 2880 intermediate size splits into whole blocks up to 90 ways)."""
    inter = layer.intermediate_size
    if whole_blocks(MXFP4, layer.moe_tp_rank * inter, inter):
        return True
    logger.warning(
        "gpt-oss: this rank's %d expert columns are not whole MXFP4 blocks of %d weights: its "
        "experts are decoded to the model dtype",
        inter,
        FORMATS[MXFP4].weights,
    )
    return False


def repack_stack(blocks: torch.Tensor, scales: torch.Tensor, gate_up: bool) -> torch.Tensor:
    """[experts, out, G, 16] blocks and [experts, out, G] scales -> uint8 [experts, out, G * 17]
    block_mxfp4 rows, one expert at a time; gate_up's alternating rows put gate (even) first,
    then up (odd)."""
    experts, out, groups = scales.shape
    if gate_up and out % 2:
        raise ValueError(f"gate_up_proj has an odd number of rows ({out})")
    stack = torch.empty(experts, out, groups * FORMATS[MXFP4].bytes, dtype=torch.uint8)
    for e in range(experts):  # straight into the stack: no per-expert temporaries
        if gate_up:
            repack_mxfp4(blocks[e, 0::2], scales[e, 0::2], stack[e, : out // 2])
            repack_mxfp4(blocks[e, 1::2], scales[e, 1::2], stack[e, out // 2 :])
        else:
            repack_mxfp4(blocks[e], scales[e], stack[e])
    return stack
