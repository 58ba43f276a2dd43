"""A whole Llama-family decoder layer in one C++ call (radixserve.kernels' llama_layer).

The layer-by-layer fast path already runs every op in a fused kernel, but each layer still makes
about ten Python module calls and dispatches; at batch sizes 1 to 8 those cost a few milliseconds
of a ~20 ms decode step. llama_layer runs the same kernels in the same order, so its output is
bitwise equal to the layer-by-layer fast path. It is used only where it can be: the C++ kernels
are built, the batch runs on the CPU paged-attention backend, one tensor-parallel rank, SiLU MLP,
no per-head q/k norm, and every projection is a float or GGUF-block weight.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from radixserve.kernels import ops
from radixserve.layers.activation import SiluAndMul
from radixserve.layers.attention.cpu_paged import CpuPagedAttnBackend
from radixserve.layers.linear import GGUF_BLOCK_BYTES, GGUFWeight

if TYPE_CHECKING:
    from radixserve.model_executor.forward_batch import ForwardBatch
    from radixserve.models.llama import LlamaDecoderLayer

FLOAT_WEIGHT = -1  # llama_layer's qtype for a plain float weight
_NO_BIAS = torch.empty(0)


def _projection(linear: nn.Module) -> tuple[torch.Tensor, int, torch.Tensor] | None:
    """(weight or GGUF blocks, qtype, bias or empty) of a linear layer, None if the kernel
    cannot run it."""
    if getattr(linear, "tp_size", 1) != 1:
        return None
    bias = linear.bias if linear.bias is not None else _NO_BIAS
    gguf: GGUFWeight | None = getattr(linear, "gguf", None)
    if gguf is not None:
        if gguf.qtype not in GGUF_BLOCK_BYTES or gguf.blocks.shape[0] != gguf.out_features:
            return None
        return gguf.blocks, gguf.qtype, bias
    if linear.weight.dim() != 2:
        return None
    return linear.weight, FLOAT_WEIGHT, bias


def fusable(layer: LlamaDecoderLayer) -> bool:
    """Whether llama_layer can run this layer (static properties only)."""
    attn = layer.self_attn
    eps = layer.input_layernorm.variance_epsilon
    return (
        ops.using_cpp_kernels()
        and attn.q_norm is None
        and isinstance(layer.mlp.act_fn, SiluAndMul)
        and layer.post_attention_layernorm.variance_epsilon == eps
        and all(
            _projection(p) is not None
            for p in (attn.qkv_proj, attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
        )
    )


def run_fused_layer(
    layer: LlamaDecoderLayer,
    positions: torch.Tensor,
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
    forward_batch: ForwardBatch,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The layer's (output, residual) in one kernel call, or None when this batch cannot take
    the fused path (the caller then runs the layer module by module)."""
    backend = forward_batch.attn_backend
    if (
        not isinstance(backend, CpuPagedAttnBackend)
        or hidden.device.type != "cpu"
        or hidden.dim() != 2
        or not hidden.is_contiguous()
        or hidden.dtype not in (torch.float32, torch.bfloat16)
        or (residual is not None and not residual.is_contiguous())
    ):
        return None
    attn = layer.self_attn
    projections = [
        _projection(p)
        for p in (attn.qkv_proj, attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
    ]
    if any(p is None for p in projections):
        return None
    rotary, radix = attn.rotary_emb, attn.attn
    k_buf, v_buf = forward_batch.kv_cache.get_kv(radix.layer_id)
    meta = backend.paged_meta
    out, res = ops.llama_layer(
        hidden,
        residual if residual is not None else _NO_BIAS,
        [layer.input_layernorm.weight, layer.post_attention_layernorm.weight],
        layer.input_layernorm.variance_epsilon,
        [p[0] for p in projections],  # type: ignore[index]
        [p[1] for p in projections],  # type: ignore[index]
        [p[2] for p in projections],  # type: ignore[index]
        positions,
        rotary.cos_sin_cache,
        rotary.rotary_dim,
        rotary.is_neox_style,
        k_buf,
        v_buf,
        forward_batch.out_cache_loc,
        forward_batch.req_to_token,
        [meta.req_pool_indices, meta.prefix_lens, meta.extend_lens, meta.q_starts],
        radix.num_heads,
        radix.num_kv_heads,
        radix.head_dim,
        radix.scaling,
    )
    return out, res
