"""Prefill attention where blocks of new tokens also see each other both ways (Gemma 3's image
tokens: ForwardBatch.bidirectional_blocks), in plain PyTorch.

The C++ and SDPA paths are causal, so a backend runs its usual attention for the whole step and
then recomputes, here, the rows of the requests that carry a block. The mask is transformers'
for Gemma 3: a query sees a key when it is causal or both are in one block, and on a
sliding-window layer only keys inside the window behind it (window AND (causal OR block)). The
cost is one gathered [new, context] score matrix per such request and layer, paid only by
prefill steps that hold image tokens (each image runs once; a repeated one is a cache hit).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from radixserve.kernels import kv_codes, reference

if TYPE_CHECKING:
    from radixserve.layers.radix_attention import RadixAttention
    from radixserve.model_executor.forward_batch import ForwardBatch


def block_mask(
    prefix: int,
    new: int,
    blocks: list[tuple[int, int]],
    sliding_window: int | None,
    device: torch.device,
) -> torch.Tensor:
    """Bool [new, prefix + new] for one request whose new tokens sit at positions
    [prefix, prefix + new); `blocks` are (first new-token index, count)."""
    query = torch.arange(prefix, prefix + new, device=device)
    key = torch.arange(prefix + new, device=device)
    mask = key[None, :] <= query[:, None]
    for first, count in blocks:
        lo, hi = prefix + first, prefix + first + count
        mask[first : first + count, lo:hi] = True
    if sliding_window is not None:
        mask &= key[None, :] > query[:, None] - sliding_window
    return mask


def recompute_block_rows(
    out: torch.Tensor, q: torch.Tensor, layer: RadixAttention, forward_batch: ForwardBatch
) -> torch.Tensor:
    """`out` [T, H*D] (the backend's causal result) with the rows of every request that holds a
    bidirectional block recomputed under the block mask; q [T, H*D], KV already stored."""
    blocks = forward_batch.bidirectional_blocks
    if not blocks or forward_batch.forward_mode.is_decode:
        return out
    kv = forward_batch.kv_cache
    k_buf, v_buf = kv.get_kv(layer.layer_id)
    k_scale, v_scale = kv.scales(layer.layer_id)
    heads, dim = layer.num_heads, layer.head_dim
    start = 0
    for i, new in enumerate(forward_batch.extend_seq_lens_cpu):
        mine = [(b - start, n) for b, n in blocks if start <= b < start + new]
        if mine:
            prefix = forward_batch.extend_prefix_lens_cpu[i]
            slots = forward_batch.req_to_token[
                forward_batch.req_pool_indices_cpu[i], : prefix + new
            ]
            k = kv_codes.decode(k_buf.index_select(0, slots), q.dtype, k_scale).transpose(0, 1)
            v = kv_codes.decode(v_buf.index_select(0, slots), q.dtype, v_scale).transpose(0, 1)
            rows = q[start : start + new].reshape(new, heads, dim).transpose(0, 1)
            mask = block_mask(prefix, new, mine, layer.sliding_window, q.device)
            o = reference.attention(
                rows[None], k[None], v[None], mask, layer.scaling, layer.logit_cap, layer.sinks
            )
            out[start : start + new] = o[0].transpose(0, 1).reshape(new, heads * dim)
        start += new
    return out
