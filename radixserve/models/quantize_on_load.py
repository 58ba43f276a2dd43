"""--quantization w8a8_int8 and bitsandbytes for float checkpoints: every decoder projection is
quantized into GGUF blocks as it loads (layers/quantization/on_load.py; the block formats in
layers/quantization/schemes.py), so the same integer kernels as --quantization gguf run it
and the model is never held in float. The LM head and the embeddings stay in float, as in
SGLang's w8a8_int8 and bitsandbytes.
"""

from __future__ import annotations

import logging

from torch import nn

from radixserve.layers.gguf_formats import type_name
from radixserve.layers.linear import LinearBase
from radixserve.layers.quantization.on_load import (
    OnLoadScheme,
    QuantizeOnLoadMethod,
    quantize_layer,
)
from radixserve.layers.quantization.schemes import SCHEMES

__all__ = ["SCHEMES", "OnLoadQuantization"]

logger = logging.getLogger(__name__)

_PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def _targets(model: nn.Module, scheme: OnLoadScheme) -> list[LinearBase]:
    """The decoder projections `scheme` quantizes (the LM head and embeddings stay float)."""
    return [
        module
        for name, module in model.named_modules()
        if name.endswith(_PROJECTIONS)
        and isinstance(module, LinearBase)
        and module.weight.dim() == 2
        and scheme.takes(module.weight.shape[1])
    ]


class OnLoadQuantization:
    """Quantizes a model's projections as its checkpoint loads: `install` before
    model.load_weights, `finish` after (logs what was made)."""

    def __init__(self, model: nn.Module, scheme: OnLoadScheme) -> None:
        self.model = model
        self.scheme = scheme
        self.layers = 0
        self.nbytes = 0

    def _count(self, nbytes: int) -> None:
        self.layers += 1
        self.nbytes += nbytes

    def install(self) -> int:
        """Give every target projection the quantize-on-load method (dropping the float
        storage it was built with); returns how many."""
        targets = _targets(self.model, self.scheme)
        for layer in targets:
            method = QuantizeOnLoadMethod(self.scheme, self._count)
            layer.quant_method = method
            method.create_weights(layer, *layer.weight.shape)
        return len(targets)

    def quantize_loaded(self) -> tuple[int, int]:
        """Quantize projections whose float weights are already filled (dummy weights), one at
        a time, each freed as soon as it is quantized; returns (layers, bytes of blocks)."""
        for layer in _targets(self.model, self.scheme):
            self._count(quantize_layer(layer, self.scheme))
        return self.layers, self.nbytes

    def finish(self) -> tuple[int, int]:
        """Log and return (layers quantized, bytes of blocks)."""
        types = sorted(
            {
                type_name(g.qtype)
                for m in self.model.modules()
                if isinstance(m, LinearBase) and (g := m.quant_method.gguf_weight()) is not None
            }
        )
        logger.info(
            "%s: %d projections quantized while loading into %s blocks (%d MB)",
            self.scheme.name,
            self.layers,
            "/".join(types) or "no",
            self.nbytes // 10**6,
        )
        return self.layers, self.nbytes
