"""Reference attention in plain PyTorch (scaled_dot_product_attention) over the paged KV cache."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from radixserve.kernels import kv_codes, reference
from radixserve.layers.attention.base import AttentionBackend

if TYPE_CHECKING:
    from radixserve.layers.radix_attention import RadixAttention
    from radixserve.model_executor.forward_batch import ForwardBatch


class TorchNativeAttnBackend(AttentionBackend):
    """Gathers each request's K/V through req_to_token and runs SDPA.

    Extend runs one SDPA per request (prefix + new tokens, causal with the prefix offset); decode
    pads the batch to its longest sequence and masks, so it is a single SDPA call. Layers with
    a sliding window, soft-capped scores or sinks run the plain-PyTorch windowed_attention instead
    (the same gather through req_to_token, with those masks, the capped softmax and the sink
    column spelled out: SDPA has no way to add a logit to the softmax denominator).
    """

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        starts, total = [], 0
        for new in forward_batch.extend_seq_lens_cpu:
            starts.append(total)
            total += new
        self._q_starts = starts
        rows = forward_batch.req_to_token[forward_batch.req_pool_indices]
        if forward_batch.forward_mode.is_decode:
            max_len = max(forward_batch.seq_lens_cpu)
            positions = torch.arange(max_len, device=rows.device)
            valid = positions[None, :] < forward_batch.seq_lens[:, None]
            pad = torch.full_like(rows[:, :max_len], forward_batch.kv_cache.pad_slot)
            self._decode_slots = torch.where(valid, rows[:, :max_len], pad)
            self._decode_mask = valid[:, None, None, :]  # [B, 1, 1, L]
        else:
            self._extend_slots = [
                rows[i, :seq_len] for i, seq_len in enumerate(forward_batch.seq_lens_cpu)
            ]
            self._extend_masks = [
                _causal_mask_with_prefix(prefix, new, rows.device)
                for prefix, new in zip(
                    forward_batch.extend_prefix_lens_cpu,
                    forward_batch.extend_seq_lens_cpu,
                    strict=True,
                )
            ]

    def _windowed(
        self, q: torch.Tensor, layer: RadixAttention, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        kv = forward_batch.kv_cache
        k_buf, v_buf = kv.get_kv(layer.layer_id)
        out = reference.windowed_attention(
            q.reshape(q.shape[0], -1),
            k_buf,
            v_buf,
            forward_batch.req_to_token,
            forward_batch.req_pool_indices_cpu,
            forward_batch.extend_prefix_lens_cpu,
            forward_batch.extend_seq_lens_cpu,
            self._q_starts,
            layer.num_heads,
            layer.scaling,
            layer.sliding_window,
            layer.logit_cap,
            layer.sinks,
            *kv.scales(layer.layer_id),
        )
        return out.view_as(q)

    def forward_extend(
        self, q: torch.Tensor, layer: RadixAttention, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        if _needs_windowed(layer):
            return self._windowed(q, layer, forward_batch)
        k_buf, v_buf = forward_batch.kv_cache.get_kv(layer.layer_id)
        k_scale, v_scale = forward_batch.kv_cache.scales(layer.layer_id)
        out = torch.empty_like(q)
        start = 0
        for i, new_len in enumerate(forward_batch.extend_seq_lens_cpu):
            slots = self._extend_slots[i]
            q_i = q[start : start + new_len].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
            # An 8-bit cache: only this request's gathered keys are widened.
            k_i = kv_codes.decode(k_buf[slots], q.dtype, k_scale)
            v_i = kv_codes.decode(v_buf[slots], q.dtype, v_scale)
            k_i = k_i.transpose(0, 1).unsqueeze(0)  # [1, Hkv, L, D]
            v_i = v_i.transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(
                q_i,
                k_i,
                v_i,
                attn_mask=self._extend_masks[i],
                scale=layer.scaling,
                enable_gqa=layer.num_heads != layer.num_kv_heads,
            )
            out[start : start + new_len] = o.squeeze(0).transpose(0, 1)
            start += new_len
        return out

    def forward_decode(
        self, q: torch.Tensor, layer: RadixAttention, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        if _needs_windowed(layer):
            return self._windowed(q, layer, forward_batch)
        k_buf, v_buf = forward_batch.kv_cache.get_kv(layer.layer_id)
        k_scale, v_scale = forward_batch.kv_cache.scales(layer.layer_id)
        k = kv_codes.decode(k_buf[self._decode_slots], q.dtype, k_scale).transpose(1, 2)
        v = kv_codes.decode(v_buf[self._decode_slots], q.dtype, v_scale).transpose(1, 2)
        o = F.scaled_dot_product_attention(
            q.unsqueeze(2),  # [B, H, 1, D]
            k,
            v,
            attn_mask=self._decode_mask,
            scale=layer.scaling,
            enable_gqa=layer.num_heads != layer.num_kv_heads,
        )
        return o.squeeze(2)


def _needs_windowed(layer: RadixAttention) -> bool:
    """Whether the layer needs more than SDPA's causal softmax."""
    return (
        layer.sliding_window is not None or layer.logit_cap is not None or layer.sinks is not None
    )


def _causal_mask_with_prefix(prefix_len: int, new_len: int, device: torch.device) -> torch.Tensor:
    """Bool [new, prefix+new]: new token j sees every prefix token and new tokens <= j."""
    total = prefix_len + new_len
    key_pos = torch.arange(total, device=device)
    query_pos = torch.arange(prefix_len, total, device=device)
    return key_pos[None, :] <= query_pos[:, None]
