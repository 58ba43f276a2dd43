"""The KV tensors: per-layer K and V buffers indexed by KV slot.

Storage only. Which slot belongs to whom is the allocator's and the prefix cache's business.
"""

from __future__ import annotations

import logging

import torch

from radixserve.kernels.kv_codes import encode, is_fp8

logger = logging.getLogger(__name__)


class KVCache:
    """K and V for `size` token slots in each of `num_layers` layers, layout [slot, head, dim].

    `v_shares_k` (multi-head latent attention, DeepSeek-V2): a token's cache row is one latent
    "head" that serves as both its key and its value (the model keeps the latent part of the
    output), so V is the very same buffer as K: stored once, and `get_kv` returns it twice.

    An 8-bit `dtype` (float8_e4m3fn / float8_e5m2, --kv-cache-dtype fp8_e4m3 / fp8_e5m2) stores
    K / k_scales[layer] and V / v_scales[layer] (kernels/kv_codes.py); the attention kernels
    read the codes as they are and apply the scales themselves (`scales`). Float caches have
    scales of 1."""

    def __init__(
        self,
        size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        owned_layers: range | None = None,
        v_shares_k: bool = False,
        k_scales: list[float] | None = None,
        v_scales: list[float] | None = None,
    ) -> None:
        self.size = size
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.v_shares_k = v_shares_k
        self.device = torch.device(device)
        self.k_scales = list(k_scales) if k_scales is not None else [1.0] * num_layers
        self.v_scales = list(v_scales) if v_scales is not None else [1.0] * num_layers
        if len(self.k_scales) != num_layers or len(self.v_scales) != num_layers:
            raise ValueError(f"KV scales: one per layer ({num_layers}) for K and for V")
        if not is_fp8(dtype) and any(s != 1.0 for s in self.k_scales + self.v_scales):
            raise ValueError(f"KV scales apply to an 8-bit KV cache only, not {dtype}")
        # One extra slot, kept at zero, that padded reads point at. The rest is left
        # uninitialised: every slot is written before it is read, and not touching a large pool
        # keeps a CPU process's resident memory proportional to what is used.
        self.pad_slot = size
        # Under --pp-size a stage stores only its own layers (`owned_layers`); the others get
        # empty buffers, so layer ids stay global.
        owned = range(num_layers) if owned_layers is None else owned_layers
        shape = (size + 1, num_kv_heads, head_dim)

        def buffer(layer: int) -> torch.Tensor:
            rows = shape if layer in owned else (0, num_kv_heads, head_dim)
            return torch.empty(rows, dtype=dtype, device=device)

        self.k_buffers = [buffer(i) for i in range(num_layers)]
        self.v_buffers = self.k_buffers if v_shares_k else [buffer(i) for i in range(num_layers)]
        for buf in self._distinct_buffers():
            if len(buf):
                buf[size].zero_()

    def _distinct_buffers(self) -> list[torch.Tensor]:
        """Every buffer once (K alone when V shares it)."""
        return self.k_buffers if self.v_shares_k else [*self.k_buffers, *self.v_buffers]

    @staticmethod
    def bytes_per_token(
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        v_shares_k: bool = False,
    ) -> int:
        element_size = torch.empty((), dtype=dtype).element_size()
        tensors = 1 if v_shares_k else 2
        return tensors * num_layers * num_kv_heads * head_dim * element_size

    def set_kv(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [num_tokens, num_kv_heads, head_dim] for the tokens stored at `slots` (v is
        ignored when it shares K's buffer: the model passes k for it)."""
        k_scale, v_scale = self.scales(layer_id)
        self.k_buffers[layer_id][slots] = encode(k, self.dtype, k_scale)
        if self.v_shares_k:
            return
        self.v_buffers[layer_id][slots] = encode(v, self.dtype, v_scale)

    def scales(self, layer_id: int) -> tuple[float, float]:
        """(k_scale, v_scale) of a layer: what its stored codes are multiplied by when read."""
        return self.k_scales[layer_id], self.v_scales[layer_id]

    def get_kv(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffers[layer_id], self.v_buffers[layer_id]

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """K and V of slots `src` copied to slots `dst`, in every layer this process holds
        (speculative decoding moves the accepted branch of a draft tree to its positions).
        Reads all sources before writing, so the two may overlap."""
        for buf in self._distinct_buffers():
            if len(buf):
                buf[dst] = buf[src]
