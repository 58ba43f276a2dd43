"""The KV tensors: per-layer K and V buffers indexed by KV slot.

Storage only. Which slot belongs to whom is the allocator's and the prefix cache's business.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)


class KVCache:
    """K and V for `size` token slots in each of `num_layers` layers, layout [slot, head, dim]."""

    def __init__(
        self,
        size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        owned_layers: range | None = None,
    ) -> None:
        self.size = size
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
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
        self.v_buffers = [buffer(i) for i in range(num_layers)]
        for buf in (*self.k_buffers, *self.v_buffers):
            if len(buf):
                buf[size].zero_()

    @staticmethod
    def bytes_per_token(
        num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        element_size = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * num_kv_heads * head_dim * element_size

    def set_kv(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [num_tokens, num_kv_heads, head_dim] for the tokens stored at `slots`."""
        self.k_buffers[layer_id][slots] = k.to(self.dtype)
        self.v_buffers[layer_id][slots] = v.to(self.dtype)

    def get_kv(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffers[layer_id], self.v_buffers[layer_id]

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """K and V of slots `src` copied to slots `dst`, in every layer this process holds
        (speculative decoding moves the accepted branch of a draft tree to its positions).
        Reads all sources before writing, so the two may overlap."""
        for buf in (*self.k_buffers, *self.v_buffers):
            if len(buf):
                buf[dst] = buf[src]
