"""--quantization gguf: keep a GGUF file's quantized blocks and run the linear layers on them.

The model is first loaded as usual (dequantised float weights from the converted cache); then
each linear layer whose GGUF tensors are of a supported block type (Q4_1, Q8_0) takes the
file's blocks instead, and its float weight is freed. Fused layers concatenate their parts'
rows (q|k|v, gate|up); llama.cpp's q/k row order is undone on whole rows of blocks, which is
exact. A tied LM head runs on the token embedding's blocks, and lookups dequantize its rows.
Layers whose tensors use other block types stay in float, and the log says how many.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from radixserve.layers.linear import GGUF_BLOCK_BYTES, attach_gguf_weight
from radixserve.models.gguf import unpermute_qk

logger = logging.getLogger(__name__)

_FUSED_PARTS = {
    "self_attn.qkv_proj": ("attn_q", "attn_k", "attn_v"),
    "self_attn.o_proj": ("attn_output",),
    "mlp.gate_up_proj": ("ffn_gate", "ffn_up"),
    "mlp.down_proj": ("ffn_down",),
}


class QuantSummary(NamedTuple):
    quantized_layers: int
    float_layers: int
    quantized_bytes: int


def apply_gguf_quantization(
    model: nn.Module,
    gguf_path: Path,
    num_heads: int,
    num_kv_heads: int,
    permuted_qk: bool,
    tied_lm_head: bool,
) -> QuantSummary:
    from gguf import GGUFReader

    reader = GGUFReader(gguf_path)
    raw = {t.name: t for t in reader.tensors}
    heads = {"attn_q": num_heads, "attn_k": num_kv_heads}
    quantized = kept = nbytes = 0
    for i, layer in enumerate(model.model.layers):
        for path, parts in _FUSED_PARTS.items():
            tensors = [raw.get(f"blk.{i}.{p}.weight") for p in parts]
            blocks = _row_blocks(tensors, parts, heads if permuted_qk else {})
            if blocks is None:
                kept += 1
                continue
            attach_gguf_weight(layer.get_submodule(path), *blocks, free_float=True)
            quantized += 1
            nbytes += blocks[0].numel()
    head_name = "token_embd.weight" if tied_lm_head else "output.weight"
    head = _row_blocks([raw.get(head_name)], ("lm_head",), {})
    if head is not None:
        # A tied table's lookups dequantize the rows they read (vocab_embedding.gguf_rows), so
        # its float copy goes too (113 MB for the default model).
        attach_gguf_weight(model.lm_head, *head)
        quantized += 1
        nbytes += head[0].numel()
    else:
        kept += 1
    logger.info(
        "GGUF quantized weights: %d layers on Q4_1/Q8_0 blocks (%.0f MB), %d kept in float",
        quantized,
        nbytes / 1e6,
        kept,
    )
    return QuantSummary(quantized, kept, nbytes)


def _row_blocks(
    tensors: list[object | None], parts: tuple[str, ...], permute_heads: dict[str, int]
) -> tuple[torch.Tensor, int] | None:
    """[N, bytes] uint8 blocks of the parts stacked by rows, and their GGML type; None if a
    part is missing or not of one supported block type."""
    if any(t is None for t in tensors):
        return None
    types = {int(t.tensor_type) for t in tensors}  # type: ignore[union-attr]
    if len(types) != 1 or next(iter(types)) not in GGUF_BLOCK_BYTES:
        return None
    rows = []
    for tensor, part in zip(tensors, parts, strict=True):
        data = np.asarray(tensor.data)  # type: ignore[union-attr]
        if part in permute_heads:
            data = unpermute_qk(data, permute_heads[part])
        rows.append(data)
    stacked = np.ascontiguousarray(np.concatenate(rows, axis=0))
    return torch.from_numpy(stacked.copy()), types.pop()
