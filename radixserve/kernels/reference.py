"""Pure-PyTorch versions of every kernel in csrc/: the fallback where the C++ extension is not
built, and the reference its self-test and the unit tests compare against."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixserve.kernels import gguf_dequant, kv_codes

GGML_Q4_1 = 3
GGML_Q8_0 = 8
BLOCK = 32
BLOCK_BYTES = {GGML_Q4_1: 20, GGML_Q8_0: 34}


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    summed = x + residual
    return rms_norm(summed, weight, eps), summed


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """Each row's greedy token: the first index of its largest logit (a NaN counts as the
    largest)."""
    return logits.argmax(dim=-1)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def _rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int, rot: int, neox: bool
) -> torch.Tensor:
    heads = x.view(x.shape[0], -1, head_dim)
    part = heads[..., :rot]
    if neox:
        x1, x2 = part.chunk(2, dim=-1)
    else:
        x1, x2 = part[..., 0::2], part[..., 1::2]
    out1, out2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    if neox:
        rotated = torch.cat([out1, out2], dim=-1)
    else:
        rotated = torch.stack([out1, out2], dim=-1).flatten(-2)
    return torch.cat([rotated, heads[..., rot:]], dim=-1).reshape(x.shape)


def rope_store_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    head_dim: int,
    rot_dim: int,
    neox: bool,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """RoPE on q and k in place, then k and v stored at `slots` of the caches (an 8-bit cache
    stores k / k_scale and v / v_scale: kernels/kv_codes.py)."""
    cos, sin = cos_sin[positions].to(q.dtype).unsqueeze(1).chunk(2, dim=-1)
    q.copy_(_rotate(q, cos, sin, head_dim, rot_dim, neox))
    k.copy_(_rotate(k, cos, sin, head_dim, rot_dim, neox))
    kv_heads = k_cache.shape[1]
    k_cache[slots] = kv_codes.encode(k.reshape(-1, kv_heads, head_dim), k_cache.dtype, k_scale)
    v_cache[slots] = kv_codes.encode(v.reshape(-1, kv_heads, head_dim), v_cache.dtype, v_scale)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: list[int],
    prefix_lens: list[int],
    extend_lens: list[int],
    q_starts: list[int],
    heads: int,
    scale: float,
    sliding_window: int | None = None,
    logit_cap: float | None = None,
    sinks: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Causal attention of each request's new tokens over its prefix and themselves; with
    `sliding_window`, `logit_cap` or `sinks`, windowed_attention's. An 8-bit cache's codes
    are widened (times k_scale, v_scale) one request's gathered keys at a time."""
    if sliding_window is not None or logit_cap is not None or sinks is not None:
        return windowed_attention(
            q,
            k_cache,
            v_cache,
            req_to_token,
            req_pool_indices,
            prefix_lens,
            extend_lens,
            q_starts,
            heads,
            scale,
            sliding_window,
            logit_cap,
            sinks,
            k_scale,
            v_scale,
        )
    kv_heads, dim = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty(q.shape[0], heads * dim, dtype=q.dtype)
    for row, prefix, new, start in zip(
        req_pool_indices, prefix_lens, extend_lens, q_starts, strict=True
    ):
        if new == 0:
            continue
        slots = req_to_token[row, : prefix + new]
        k = kv_codes.decode(k_cache.index_select(0, slots), q.dtype, k_scale).transpose(0, 1)
        v = kv_codes.decode(v_cache.index_select(0, slots), q.dtype, v_scale).transpose(0, 1)
        qi = q[start : start + new].reshape(new, heads, dim).transpose(0, 1)  # [H, n, D]
        mask = torch.arange(prefix + new)[None, :] <= torch.arange(prefix, prefix + new)[:, None]
        o = F.scaled_dot_product_attention(
            qi.unsqueeze(0),
            k.unsqueeze(0),
            v.unsqueeze(0),
            attn_mask=mask,
            scale=scale,
            enable_gqa=heads != kv_heads,
        )
        out[start : start + new] = o[0].transpose(0, 1).reshape(new, heads * dim)
    return out


# Query rows attended at a time by windowed_attention: bounds its score matrix, and under a
# sliding window lets each block read only the keys its rows can see.
QUERY_BLOCK = 256


def visible_keys(
    query_pos: torch.Tensor, key_pos: torch.Tensor, sliding_window: int | None
) -> torch.Tensor:
    """Bool [queries, keys]: a query sees keys at its position or before, and with a sliding
    window only the last `sliding_window` of those (its own included), as transformers masks."""
    mask = key_pos[None, :] <= query_pos[:, None]
    if sliding_window is not None:
        mask &= key_pos[None, :] > query_pos[:, None] - sliding_window
    return mask


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    logit_cap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [B, H, n, D], k and v [B, Hkv, L, D], mask bool broadcastable to [B, H, n, L] (every
    query sees at least one key) -> [B, H, n, D]. With `logit_cap`, the scaled scores become
    cap * tanh(score / cap) before masking and softmax; with `sinks` [H] (gpt-oss), each head's
    sink logit joins the softmax denominator as one more column that is dropped afterwards
    (it weighs no value). SDPA has neither step, so the product is spelled out as
    transformers' eager attention does (softmax in float32)."""
    if logit_cap is None and sinks is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
        )
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if logit_cap is not None:
        scores = torch.tanh(scores / logit_cap) * logit_cap
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is None:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    else:
        probs = softmax_with_sinks(scores, sinks).to(q.dtype)
    return torch.matmul(probs, v)


def softmax_with_sinks(scores: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """scores [B, H, n, L] -> float32 probabilities over the keys of a softmax whose
    denominator also holds exp(sinks[h]): the rows sum to less than 1."""
    b, h, n, _ = scores.shape
    sink_column = sinks.to(torch.float32).view(1, h, 1, 1).expand(b, h, n, 1)
    combined = torch.cat([scores.to(torch.float32), sink_column], dim=-1)
    return torch.softmax(combined, dim=-1)[..., :-1]


def windowed_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: list[int],
    prefix_lens: list[int],
    extend_lens: list[int],
    q_starts: list[int],
    heads: int,
    scale: float,
    sliding_window: int | None,
    logit_cap: float | None,
    sinks: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """paged_attention with a sliding window, soft-capped scores and/or sinks (see attention), in
    blocks of QUERY_BLOCK query rows, each reading only the keys its rows can see: under a
    window a long prefill costs rows x window, not rows x context."""
    dim = k_cache.shape[2]
    out = torch.empty(q.shape[0], heads * dim, dtype=q.dtype, device=q.device)
    for row, prefix, new, start in zip(
        req_pool_indices, prefix_lens, extend_lens, q_starts, strict=True
    ):
        for r0 in range(0, new, QUERY_BLOCK):
            n = min(QUERY_BLOCK, new - r0)
            first, end = prefix + r0, prefix + r0 + n  # positions [first, end) attend
            key_start = 0 if sliding_window is None else max(0, first - sliding_window + 1)
            slots = req_to_token[row, key_start:end]
            k = kv_codes.decode(k_cache.index_select(0, slots), q.dtype, k_scale)
            v = kv_codes.decode(v_cache.index_select(0, slots), q.dtype, v_scale)
            k, v = k.transpose(0, 1), v.transpose(0, 1)  # [Hkv, L, D]
            rows = q[start + r0 : start + r0 + n].reshape(n, heads, dim).transpose(0, 1)
            mask = visible_keys(
                torch.arange(first, end, device=q.device),
                torch.arange(key_start, end, device=q.device),
                sliding_window,
            )
            o = attention(rows[None], k[None], v[None], mask, scale, logit_cap, sinks)
            out[start + r0 : start + r0 + n] = o[0].transpose(0, 1).reshape(n, heads * dim)
    return out


def gguf_linear_argmax(
    x: torch.Tensor, blocks: torch.Tensor, qtype: int, out_features: int, columns: int
) -> torch.Tensor:
    """Greedy sampling's LM head on GGUF blocks: each row's argmax over the first `columns`
    outputs of gguf_linear (the C++ kernel never writes the logits where it can)."""
    return argmax_rows(gguf_linear(x, blocks, qtype, out_features)[:, :columns])


def half_weight_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """float32 x @ W^T (+ bias) for a bfloat16/float16 weight, widened whole (exact per value:
    HF transformers' float32 product)."""
    return F.linear(x, weight.to(x.dtype), bias)


def float_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., in] @ W^T (+ bias): what the packed float kernel computes, in another order."""
    return F.linear(x, weight, bias)


def q4_1_codes(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_1 blocks [N, K / 32 * 20] -> (q uint8 [N, nb, 32] in 0..15, d and m float32
    [N, nb, 1]), with w = d * q + m. A block keeps weights 0-15 in the low nibbles of its 16
    bytes and 16-31 in the high ones."""
    b = blocks.reshape(blocks.shape[0], -1, BLOCK_BYTES[GGML_Q4_1])
    d = b[..., 0:2].contiguous().view(torch.float16).to(torch.float32)
    m = b[..., 2:4].contiguous().view(torch.float16).to(torch.float32)
    qs = b[..., 4:]
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1), d, m


def dequantize_blocks(blocks: torch.Tensor, qtype: int, out_features: int) -> torch.Tensor:
    """GGUF blocks [N, row bytes] of any GGML type -> float32 weight [N, K]."""
    return gguf_dequant.dequantize_rows(blocks, qtype, out_features)


# Output rows dequantized at a time by gguf_linear: a tile, never the whole weight in float.
GGUF_TILE_ELEMENTS = 1 << 22


def gguf_linear(
    x: torch.Tensor, blocks: torch.Tensor, qtype: int, out_features: int
) -> torch.Tensor:
    """x @ W^T with W dequantised from its blocks a tile of rows at a time (exact float weights,
    no activation quantisation: slower than the C++ kernels but the same function up to
    rounding, and it runs every block type)."""
    blocks = blocks.reshape(out_features, -1)
    k = x.shape[-1]
    tile = max(1, GGUF_TILE_ELEMENTS // max(k, 1))
    if tile >= out_features:
        return F.linear(x, dequantize_blocks(blocks, qtype, out_features).to(x.dtype))
    out = x.new_empty(*x.shape[:-1], out_features)
    for start in range(0, out_features, tile):
        rows = min(tile, out_features - start)
        w = dequantize_blocks(blocks[start : start + rows], qtype, rows).to(x.dtype)
        out[..., start : start + rows] = F.linear(x, w)
    return out
