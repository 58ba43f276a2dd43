"""kv_b_proj from the two halves newer llama.cpp files store instead (convert_hf_to_gguf.py,
for its absorbed MLA): attn_k_b [heads, kv_lora_rank, qk_nope] (the key half, transposed per
head) and attn_v_b [heads, v_head_dim, kv_lora_rank], loaded under the names k_b_proj and
v_b_proj. transformers' kv_b_proj is [heads * (qk_nope + v), kv_lora_rank], each head's key
rows then its value rows."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

_K_HALF, _V_HALF = ".k_b_proj.weight", ".v_b_proj.weight"


def join_kv_b(k_b: torch.Tensor, v_b: torch.Tensor) -> torch.Tensor:
    """[heads, latent, nope] and [heads, v, latent] -> [heads * (nope + v), latent]."""
    if k_b.dim() != 3 or v_b.dim() != 3 or k_b.shape[0] != v_b.shape[0]:
        raise ValueError(f"k_b {tuple(k_b.shape)} and v_b {tuple(v_b.shape)} do not pair up")
    per_head = torch.cat([k_b.transpose(1, 2), v_b], dim=1)
    return per_head.reshape(-1, per_head.shape[-1]).contiguous()


def with_joined_kv_b(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """`weights` with each layer's k_b_proj and v_b_proj (in either order, not necessarily
    adjacent) replaced by one kv_b_proj; everything else passes through as it comes."""
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        suffix = _K_HALF if name.endswith(_K_HALF) else _V_HALF if name.endswith(_V_HALF) else ""
        if not suffix:
            yield name, tensor
            continue
        stem = name.removesuffix(suffix)
        pair = halves.setdefault(stem, {})
        pair[suffix] = tensor
        if len(pair) == 2:
            del halves[stem]
            yield f"{stem}.kv_b_proj.weight", join_kv_b(pair[_K_HALF], pair[_V_HALF])
    if halves:
        raise ValueError(f"the checkpoint has one half of kv_b_proj only: {sorted(halves)}")
