"""The fast CPU attention backend (SGLang's name for its CPU backend: intel_amx).

Attention reads K/V through the request-to-token table inside one kernel call per layer
(radixserve.kernels: C++ where built, PyTorch otherwise), for decode, extend and mixed batches
alike; RoPE and the KV store are fused into one more call. No per-request Python work per layer.
Attention sinks (gpt-oss) the kernel adds to the softmax denominator. Layers with soft-capped
scores, and sliding-window layers in batches where the kernel cannot see
exactly the window, take the PyTorch reference (kernels/ops.paged_attention says which).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from radixserve.kernels import ops
from radixserve.layers.attention.base import AttentionBackend
from radixserve.layers.attention.bidirectional import recompute_block_rows

if TYPE_CHECKING:
    from radixserve.layers.radix_attention import RadixAttention
    from radixserve.layers.rotary_embedding import RotaryEmbedding
    from radixserve.model_executor.forward_batch import ForwardBatch


class CpuPagedAttnBackend(AttentionBackend):
    fuses_rope = True

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        self.paged_meta = ops.PagedMeta.build(
            forward_batch.req_pool_indices_cpu,
            forward_batch.extend_prefix_lens_cpu,
            forward_batch.extend_seq_lens_cpu,
        )

    def forward_with_rope(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        positions: torch.Tensor,
        rotary: RotaryEmbedding,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        """q [T, H*D], k and v [T, Hkv*D] (views of the fused qkv are fine) -> [T, H*D]."""
        k_buf, v_buf = forward_batch.kv_cache.get_kv(layer.layer_id)
        if torch.compiler.is_compiling():
            # Under --enable-torch-compile: one opaque op (layers/compile_ops.py).
            from radixserve.layers.compile_ops import rope_paged_attention

            meta = self.paged_meta
            return rope_paged_attention(
                q,
                k,
                v,
                positions,
                rotary.cos_sin_cache,
                k_buf,
                v_buf,
                forward_batch.out_cache_loc,
                forward_batch.req_to_token,
                meta.req_pool_indices,
                meta.prefix_lens,
                meta.extend_lens,
                meta.q_starts,
                layer.head_dim,
                rotary.rotary_dim,
                rotary.is_neox_style,
                layer.num_heads,
                layer.scaling,
                layer.sliding_window,
                layer.logit_cap,
                layer.sinks,
            )
        ops.rope_store_kv(
            q,
            k,
            v,
            positions,
            rotary.cos_sin_cache,
            k_buf,
            v_buf,
            forward_batch.out_cache_loc,
            layer.head_dim,
            rotary.rotary_dim,
            rotary.is_neox_style,
            *forward_batch.kv_cache.scales(layer.layer_id),
        )
        out = self._attend(q, layer, forward_batch)
        if forward_batch.bidirectional_blocks:
            # Image tokens that see each other both ways (Gemma 3): those requests' rows again.
            out = recompute_block_rows(out, q, layer, forward_batch)
        return out

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        """KV store and attention without RoPE (a NoPE layer); q [T, H*D], k and v [T, Hkv*D]."""
        if not torch.compiler.is_compiling():
            return super().forward(q, k, v, layer, forward_batch)
        # One opaque op, as forward_with_rope: traced, the PyTorch attention would specialise
        # on each request's context length and recompile every step.
        from radixserve.layers.compile_ops import store_paged_attention

        k_buf, v_buf = forward_batch.kv_cache.get_kv(layer.layer_id)
        meta = self.paged_meta
        return store_paged_attention(
            q,
            k,
            v,
            k_buf,
            v_buf,
            forward_batch.out_cache_loc,
            forward_batch.req_to_token,
            meta.req_pool_indices,
            meta.prefix_lens,
            meta.extend_lens,
            meta.q_starts,
            layer.num_heads,
            layer.scaling,
            layer.sliding_window,
            layer.logit_cap,
            layer.sinks,
        )

    def _attend(
        self, q: torch.Tensor, layer: RadixAttention, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        kv = forward_batch.kv_cache
        k_buf, v_buf = kv.get_kv(layer.layer_id)
        k_scale, v_scale = kv.scales(layer.layer_id)
        return ops.paged_attention(
            q,
            k_buf,
            v_buf,
            forward_batch.req_to_token,
            self.paged_meta,
            layer.num_heads,
            layer.scaling,
            layer.sliding_window,
            layer.logit_cap,
            layer.sinks,
            k_scale,
            v_scale,
        )

    def forward_extend(
        self, q: torch.Tensor, layer: RadixAttention, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        return self._attend(q.reshape(q.shape[0], -1), layer, forward_batch).view_as(q)

    def forward_decode(
        self, q: torch.Tensor, layer: RadixAttention, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        return self._attend(q.reshape(q.shape[0], -1), layer, forward_batch).view_as(q)
