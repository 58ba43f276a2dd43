"""Quantizing a float checkpoint layer by layer while it loads (--quantization w8a8_int8,
bitsandbytes): a layer's float weight exists only from its first shard's arrival to its last;
then it becomes GGUF blocks (one of the formats the integer kernels run) and the float storage
is freed at once, so loading never holds the model in float.

The layer is then on GGUFLinearMethod, like a layer loaded from a GGUF file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from radixserve.layers.quantization.base import LinearMethod
from radixserve.layers.quantization.gguf import use_gguf_blocks

# One layer's float weight [out, in] -> its blocks and their GGML type.
BlockQuantizer = Callable[[torch.Tensor], tuple[torch.Tensor, int]]


@dataclass(frozen=True)
class OnLoadScheme:
    """A --quantization choice that quantizes float weights into blocks while loading."""

    name: str  # the --quantization value
    quantize: BlockQuantizer
    block: int  # the input features must be a multiple of this (32)

    def takes(self, input_size: int) -> bool:
        return input_size % self.block == 0


def quantize_layer(layer: nn.Module, scheme: OnLoadScheme) -> int:
    """Quantize `layer`'s loaded float weight now and free it; returns the bytes of blocks."""
    blocks, qtype = scheme.quantize(layer.weight.data)
    use_gguf_blocks(layer, [(blocks, qtype)])
    return blocks.numel()


class QuantizeOnLoadMethod(LinearMethod):
    """The method of a layer while it loads: its weight has no storage until the first shard
    arrives (fused layers get several: q, k, v), and is quantized the moment the last one has
    been copied in (the layer's quant_method then becomes the blocks' method). Not a frozen
    value: it counts the shards still to come."""

    def __init__(self, scheme: OnLoadScheme, on_quantized: Callable[[int], None]) -> None:
        self.scheme = scheme
        self._on_quantized = on_quantized  # told the bytes of blocks each layer became
        self._shape: tuple[int, ...] = ()
        self._pending: set[object] = set()

    def create_weights(self, layer: nn.Module, output_size: int, input_size: int) -> None:
        """Take over the layer's float weight parameter (built by the float method, with its
        loader and shard ids): its storage is dropped now and allocated at the first shard."""
        weight = layer.weight
        if tuple(weight.shape) != (output_size, input_size):
            raise ValueError(f"weight {tuple(weight.shape)} is not [{output_size}, {input_size}]")
        self._shape = (output_size, input_size)
        self._pending = set(getattr(weight, "shard_ids", (None,)))
        weight.data = torch.empty(0, dtype=weight.dtype)
        copy_shard = weight.weight_loader

        def load_shard(
            param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
        ) -> None:
            if param.numel() == 0:
                param.data = torch.empty(self._shape, dtype=param.dtype)
            copy_shard(param, loaded_weight, shard_id)
            self._pending.discard(shard_id)
            if not self._pending:
                self._on_quantized(quantize_layer(layer, self.scheme))

        weight.weight_loader = load_shard

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        # Reached only if the checkpoint lacked a shard and the loader did not say so.
        raise ValueError(f"{self.scheme.name}: a layer's weight was never completely loaded")

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        raise RuntimeError(f"{self.scheme.name}: the layer is still loading")
