"""The C++ kernels that torch.compile must not look inside, as opaque torch custom ops.

Under torch.compile (--enable-torch-compile, model_executor/compiled_decode.py) the decoder runs
module by module on plain PyTorch ops that inductor fuses, except for these calls:
- attention with its RoPE (if the layer has one) and KV store: one opaque op per layer, so a changing context length
  (how many keys each request reads) is data the op reads at run time, never a shape dynamo
  specialises on, and a decode step does not recompile as sequences grow (SGLang registers its
  CPU attention as an opaque op for the same reason);
- the kernel ops declared with a fake in kernels/op_table.py, registered from that table: the
  float matmuls of the decoder (ops.float_linear: radixserve's packed AVX2 kernel where it
  measured faster than torch's BLAS, which inductor would call; the LM head stays inductor's)
  and the GGUF block GEMV (inductor would otherwise dequantize the blocks and, with freezing,
  constant-fold them into float weights four to eight times their size).
register_fake gives dynamo each op's output shape without running it.
"""

from __future__ import annotations

from typing import Any

import torch

from radixserve.kernels import op_table, ops
from radixserve.kernels.op_table import KernelOp


@torch.library.custom_op("radixserve::rope_paged_attention", mutates_args=("k_cache", "v_cache"))
def rope_paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    q_starts: torch.Tensor,
    head_dim: int,
    rot_dim: int,
    neox: bool,
    heads: int,
    scale: float,
    sliding_window: int | None,
    logit_cap: float | None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, H*D], k and v [T, Hkv*D] -> attention output [T, H*D]. Stores the rotated k and v
    at `slots`; q and k are not modified (the eager kernel rotates in place, so it gets copies:
    a custom op may not mutate its non-declared inputs). A sliding window, soft-capped scores
    and sinks are honoured as in eager mode (ops.paged_attention)."""
    q = q.clone()
    k = k.clone()
    ops.rope_store_kv(q, k, v, positions, cos_sin, k_cache, v_cache, slots, head_dim, rot_dim, neox)
    meta = _paged_meta(req_pool_indices, prefix_lens, extend_lens, q_starts)
    return ops.paged_attention(
        q, k_cache, v_cache, req_to_token, meta, heads, scale, sliding_window, logit_cap, sinks
    )


def _paged_meta(
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    q_starts: torch.Tensor,
) -> ops.PagedMeta:
    """The attention kernels' batch description, from the op's tensors (lists included)."""
    return ops.PagedMeta(
        req_pool_indices,
        prefix_lens,
        extend_lens,
        q_starts,
        req_pool_indices.tolist(),
        prefix_lens.tolist(),
        extend_lens.tolist(),
        q_starts.tolist(),
    )


@rope_paged_attention.register_fake
def _(q: torch.Tensor, *args: object) -> torch.Tensor:
    return torch.empty_like(q, memory_format=torch.contiguous_format)


@torch.library.custom_op("radixserve::store_paged_attention", mutates_args=("k_cache", "v_cache"))
def store_paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    q_starts: torch.Tensor,
    heads: int,
    scale: float,
    sliding_window: int | None,
    logit_cap: float | None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """rope_paged_attention without the RoPE, for layers that apply none (SmolLM3's NoPE
    layers): stores k and v at `slots`, then attends."""
    kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2]
    k_cache[slots] = k.reshape(-1, kv_heads, head_dim).to(k_cache.dtype)
    v_cache[slots] = v.reshape(-1, kv_heads, head_dim).to(v_cache.dtype)
    meta = _paged_meta(req_pool_indices, prefix_lens, extend_lens, q_starts)
    return ops.paged_attention(
        q, k_cache, v_cache, req_to_token, meta, heads, scale, sliding_window, logit_cap, sinks
    )


@store_paged_attention.register_fake
def _(q: torch.Tensor, *args: object) -> torch.Tensor:
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def _register(op: KernelOp[..., Any]) -> None:
    """torch.ops.radixserve.<name> for a table op with a fake: the eager dispatcher of
    kernels.ops behind it (contiguous inputs: the kernels read rows of them), the fake for
    dynamo. The schema comes from the op's reference."""
    eager = getattr(ops, op.name)

    def run(*args: Any) -> Any:
        return eager(*(a.contiguous() if isinstance(a, torch.Tensor) else a for a in args))

    custom = torch.library.custom_op(
        f"radixserve::{op.name}", run, mutates_args=op.mutates, schema=op.schema
    )
    custom.register_fake(op.fake)


for _op in op_table.TABLE:
    if _op.fake is not None:
        _register(_op)
