"""A whole Llama-family decoder layer in one C++ call (radixserve.kernels' llama_layer).

The layer-by-layer fast path already runs every op in a fused kernel, but each layer still makes
about ten Python module calls and dispatches; at batch sizes 1 to 8 those cost a few milliseconds
of a ~20 ms decode step. llama_layer runs the same kernels in the same order, so its output is
bitwise equal to the layer-by-layer fast path. It is used only where it can be: the C++ kernels
are built, the batch runs on the CPU paged-attention backend, one tensor-parallel rank, SiLU MLP,
no q/k norm but per-head RMSNorms (Qwen3's), RoPE on every layer, full causal attention without
soft-capping, block outputs joining the residual unscaled, every projection a float or
GGUF-block weight, and a SiLU MLP or a MoE block on GGUF experts (layers/moe/fused_call.py;
those two only in a LlamaLayerChain). Layers that differ (OLMo 2's full-width q/k norms,
SmolLM3's NoPE layers, Granite's residual_multiplier, Gemma's capped scores, shared experts)
run module by module, still on the fused norm, activation and RoPE + attention kernels where
those apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import nn

from radixserve.kernels import ops
from radixserve.layers.activation import SiluAndMul
from radixserve.layers.attention.cpu_paged import CpuPagedAttnBackend
from radixserve.layers.layernorm import RMSNorm
from radixserve.layers.linear import LinearBase, fused_operands
from radixserve.layers.moe import MoECallArgs, expert_stats, moe_call_args, routed_capture

if TYPE_CHECKING:
    from radixserve.mem_cache.kv_cache import KVCache
    from radixserve.model_executor.forward_batch import ForwardBatch

# A Llama-shaped decoder layer (models/llama.py's LlamaDecoderLayer; layers/ may not import
# models/): self_attn (qkv_proj, o_proj, q_norm, rotary_emb or None, attn), mlp (gate_up_proj,
# down_proj, act_fn), input_layernorm, post_attention_layernorm, residual_multiplier.
LlamaDecoderLayer = nn.Module

_NO_BIAS = torch.empty(0)


def _projection(
    linear: LinearBase,
) -> tuple[list[torch.Tensor], list[int], torch.Tensor] | None:
    """(weights or GGUF blocks of each part, their qtypes, bias or empty) of a linear layer, None
    if the kernel cannot run it (linear.fused_operands). One part, except a fused layer whose
    parts have different GGUF block types (Q4_K_M's q|k|v with a Q6_K v): the kernel runs those
    part by part."""
    operands = fused_operands(linear)
    if operands is None:
        return None
    bias = linear.bias if linear.bias is not None else _NO_BIAS
    return list(operands.weights), list(operands.qtypes), bias


def fusable(layer: LlamaDecoderLayer) -> bool:
    """Whether llama_layer can run this layer (static properties only)."""
    if not hasattr(layer.input_layernorm, "variance_epsilon"):
        return False  # no input norm (an EAGLE head's first layer): the kernel always has one
    eps = layer.input_layernorm.variance_epsilon
    attn = layer.self_attn
    return (
        ops.using_cpp_kernels()
        and (attn.q_norm is None or _per_head_norms(attn) is not None)
        and attn.rotary_emb is not None
        # The C++ layer's attention has no soft-capping; a sliding window it runs only for
        # batches that the window does not mask (FusedLayerArgs.window).
        and attn.attn.logit_cap is None
        # Nor a softmax sink (gpt-oss): sink layers run module by module.
        and attn.attn.sinks is None
        and layer.residual_multiplier == 1.0
        # A dense SiLU MLP, or a MoE block the C++ layer runs (layers/moe/fused_call.py).
        and (
            isinstance(getattr(layer.mlp, "act_fn", None), SiluAndMul)
            or moe_call_args(layer.mlp) is not None
        )
        and layer.post_attention_layernorm.variance_epsilon == eps
        and fused_layer_args(layer) is not None
    )


def _per_head_norms(attn: nn.Module) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    """(q weight, k weight, eps) of per-head RMSNorms on q and k (Qwen3's), which the C++
    layer applies as LlamaAttention._norm_heads does with the fast kernels; None for any other
    q/k norm (OLMo 2's full-width ones, Gemma's offset weights)."""
    q_norm, k_norm = attn.q_norm, attn.k_norm
    if type(q_norm) is not RMSNorm or type(k_norm) is not RMSNorm:
        return None
    if q_norm.hidden_size != attn.head_dim or k_norm.hidden_size != attn.head_dim:
        return None
    if q_norm.variance_epsilon != k_norm.variance_epsilon:
        return None
    return q_norm.weight, k_norm.weight, q_norm.variance_epsilon


class FusedLayerArgs(NamedTuple):
    """The arguments of llama_layer that do not change from step to step (gathered once per
    layer: the per-step Python work is then a few attribute reads)."""

    norms: list[torch.Tensor]
    eps: float
    weights: list[torch.Tensor]  # every part of qkv, o, gate_up, down in turn
    qtypes: list[int]  # one per part
    part_counts: list[int]  # parts of qkv, o, gate_up, down
    biases: list[torch.Tensor]
    cos_sin: torch.Tensor
    rot_dim: int
    neox: bool
    layer_id: int
    heads: int
    kv_heads: int
    head_dim: int
    scale: float
    # The layer's sliding window (keys a token sees, its own included), None: all. The kernel
    # attends over every key, so it runs only batches whose sequences fit the window.
    window: int | None = None
    # Per-head q/k RMSNorms (q weight, k weight, eps), and a MoE MLP in place of gate_up/down:
    # set on a LlamaLayerChain after it is made (the per-layer llama_layer call has neither).
    qk_norms: tuple[torch.Tensor, torch.Tensor, float] | None = None
    moe: MoECallArgs | None = None

    @property
    def chain_only(self) -> bool:
        """Whether only a LlamaLayerChain runs this layer (llama_layer cannot)."""
        return self.qk_norms is not None or self.moe is not None


def fused_layer_args(layer: LlamaDecoderLayer) -> FusedLayerArgs | None:
    attn = layer.self_attn
    moe = moe_call_args(layer.mlp)
    linears = [attn.qkv_proj, attn.o_proj]
    if moe is None:
        linears += [layer.mlp.gate_up_proj, layer.mlp.down_proj]
    projections = [_projection(p) for p in linears]
    if any(p is None for p in projections):
        return None
    qk_norms = _per_head_norms(attn) if attn.q_norm is not None else None
    if attn.q_norm is not None and qk_norms is None:
        return None
    # A MoE layer's MLP has no dense parts (kernels.h: part counts 0, set_moe).
    mlp_parts = [([], [], _NO_BIAS)] * 2 if moe is not None else []
    projections = projections + mlp_parts  # type: ignore[operator]
    rotary, radix = attn.rotary_emb, attn.attn
    return FusedLayerArgs(
        norms=[layer.input_layernorm.weight, layer.post_attention_layernorm.weight],
        eps=layer.input_layernorm.variance_epsilon,
        weights=[w for p in projections for w in p[0]],  # type: ignore[index]
        qtypes=[q for p in projections for q in p[1]],  # type: ignore[index]
        part_counts=[len(p[0]) for p in projections],  # type: ignore[index]
        biases=[p[2] for p in projections],  # type: ignore[index]
        cos_sin=rotary.cos_sin_cache,
        rot_dim=rotary.rotary_dim,
        neox=rotary.is_neox_style,
        layer_id=radix.layer_id,
        heads=radix.num_heads,
        kv_heads=radix.num_kv_heads,
        head_dim=radix.head_dim,
        scale=radix.scaling,
        window=radix.sliding_window,
        qk_norms=qk_norms,
        moe=moe,
    )


def _can_run_fused(
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
    forward_batch: ForwardBatch,
    window: int | None = None,
) -> bool:
    return not (
        torch.compiler.is_compiling()  # traced module by module (model_executor/compiled_decode.py)
        or not isinstance(forward_batch.attn_backend, CpuPagedAttnBackend)
        or hidden.device.type != "cpu"
        or hidden.dim() != 2
        or not hidden.is_contiguous()
        or hidden.dtype not in (torch.float32, torch.bfloat16)
        or (residual is not None and not residual.is_contiguous())
        or (window is not None and not _within_window(forward_batch, window))
    )


def _within_window(forward_batch: ForwardBatch, window: int) -> bool:
    """Whether no sequence of the batch is longer than `window` (prefix and new tokens), so
    the window masks nothing and full attention gives the windowed result."""
    meta = forward_batch.attn_backend.paged_meta
    lengths = map(sum, zip(meta.prefix_lens_list, meta.extend_lens_list, strict=True))
    return max(lengths, default=0) <= window


def _smallest_window(layer_args: Sequence[FusedLayerArgs]) -> int | None:
    windows = [args.window for args in layer_args if args.window is not None]
    return min(windows) if windows else None


def _call_fused(
    args: FusedLayerArgs,
    positions: torch.Tensor,
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
    forward_batch: ForwardBatch,
    meta: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    kv = forward_batch.kv_cache
    k_buf, v_buf = kv.get_kv(args.layer_id)
    k_scale, v_scale = kv.scales(args.layer_id)
    return ops.llama_layer(
        hidden,
        residual if residual is not None else _NO_BIAS,
        args.norms,
        args.eps,
        args.weights,
        args.qtypes,
        args.part_counts,
        args.biases,
        positions,
        args.cos_sin,
        args.rot_dim,
        args.neox,
        k_buf,
        v_buf,
        forward_batch.out_cache_loc,
        forward_batch.req_to_token,
        meta,
        args.heads,
        args.kv_heads,
        args.head_dim,
        args.scale,
        k_scale,
        v_scale,
    )


def _paged_meta_list(forward_batch: ForwardBatch) -> list[torch.Tensor]:
    meta = forward_batch.attn_backend.paged_meta
    return [meta.req_pool_indices, meta.prefix_lens, meta.extend_lens, meta.q_starts]


def run_fused_layer(
    args: FusedLayerArgs,
    positions: torch.Tensor,
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
    forward_batch: ForwardBatch,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The layer's (output, residual) in one kernel call, or None when this batch cannot take
    the fused path (the caller then runs the layer module by module)."""
    if args.chain_only or not _can_run_fused(hidden, residual, forward_batch, args.window):
        return None
    return _call_fused(
        args, positions, hidden, residual, forward_batch, _paged_meta_list(forward_batch)
    )


class LayerChainCache:
    """The C++ LlamaLayerChain of a model's current fused arguments. It holds the weights
    itself, so it is rebuilt whenever a layer's FusedLayerArgs object changes
    (use_fast_kernels makes new ones after the weights change form)."""

    def __init__(self) -> None:
        self._args: list[FusedLayerArgs] = []
        self._chain: object | None = None
        # The KV cache whose per-layer scales the chain holds (an 8-bit cache's; 1 otherwise).
        self._scales_of: KVCache | None = None

    @property
    def current(self) -> object | None:
        """The chain built last (None before the first forward or without the C++ kernels)."""
        return self._chain

    def get(self, layer_args: Sequence[FusedLayerArgs]) -> object | None:
        """The chain for these arguments, or None without the C++ kernels."""
        same = len(layer_args) == len(self._args) and all(
            a is b for a, b in zip(layer_args, self._args, strict=True)
        )
        if not same:
            self._args = list(layer_args)
            self._chain = ops.make_layer_chain(
                [t for a in layer_args for t in a.norms],
                [a.eps for a in layer_args],
                [t for a in layer_args for t in a.weights],
                [q for a in layer_args for q in a.qtypes],
                [c for a in layer_args for c in a.part_counts],
                [t for a in layer_args for t in a.biases],
                [a.cos_sin for a in layer_args],
                [a.rot_dim for a in layer_args],
                [a.neox for a in layer_args],
                [a.heads for a in layer_args],
                [a.kv_heads for a in layer_args],
                [a.head_dim for a in layer_args],
                [a.scale for a in layer_args],
            )
            self._scales_of = None
            if self._chain is not None:
                _set_chain_extras(self._chain, layer_args)
        return self._chain

    def set_kv_scales(self, kv: KVCache, layer_args: Sequence[FusedLayerArgs]) -> None:
        """Give the chain `kv`'s per-layer K/V scales (once per cache: they are fixed)."""
        if self._chain is None or self._scales_of is kv:
            return
        for i, args in enumerate(layer_args):
            self._chain.set_kv_scales(i, *kv.scales(args.layer_id))  # type: ignore[attr-defined]
        self._scales_of = kv


def _set_chain_extras(chain: object, layer_args: Sequence[FusedLayerArgs]) -> None:
    """The per-head q/k norms and MoE blocks, which the chain takes layer by layer."""
    for i, args in enumerate(layer_args):
        if args.qk_norms is not None:
            chain.set_qk_norm(i, *args.qk_norms)  # type: ignore[attr-defined]
        if args.moe is not None:
            chain.set_moe(i, *args.moe)  # type: ignore[attr-defined]


def run_fused_layers(
    layer_args: Sequence[FusedLayerArgs],
    positions: torch.Tensor,
    hidden: torch.Tensor,
    forward_batch: ForwardBatch,
    chains: LayerChainCache | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """All decoder layers from the embeddings: (output, residual), or None when this batch
    cannot take the fused path. With `chains`, one C++ call runs every layer (LlamaLayerChain);
    else one llama_layer call per layer from Python. Either way the same calls in the same order
    as run_fused_layer layer by layer, so the same results; the batch is checked once instead of
    per layer and no module is called in between (at batch 1 the per-layer Python was ~0.4 ms
    of a ~12 ms step, and the Python loop with its ~20 arguments per call another ~0.2-0.3 ms).
    The kernel returns contiguous float tensors, so what was checked for the first layer holds
    for the rest."""
    if not layer_args or not _can_run_fused(
        hidden, None, forward_batch, _smallest_window(layer_args)
    ):
        return None
    reporting = expert_stats.recording() or routed_capture.capturing()
    if reporting and any(args.moe is not None for args in layer_args):
        # The chain routes inside C++ and reports nothing: module by module while counting
        # or capturing routed experts.
        return None
    meta = _paged_meta_list(forward_batch)
    chain = chains.get(layer_args) if chains is not None else None
    if chain is not None:
        kv = forward_batch.kv_cache
        assert chains is not None
        chains.set_kv_scales(kv, layer_args)
        caches = [kv.get_kv(args.layer_id) for args in layer_args]
        return ops.run_layer_chain(
            chain,
            hidden,
            positions,
            [k for k, _ in caches],
            [v for _, v in caches],
            forward_batch.out_cache_loc,
            forward_batch.req_to_token,
            meta,
        )
    if any(args.chain_only for args in layer_args):
        return None  # no chain was made: llama_layer alone cannot run these layers
    residual: torch.Tensor | None = None
    for args in layer_args:
        hidden, residual = _call_fused(args, positions, hidden, residual, forward_batch, meta)
    assert residual is not None
    return hidden, residual
