"""Per-layer quantization methods (create weights, process them after loading, apply): see
base.py."""

from radixserve.layers.quantization.base import (
    FLOAT_WEIGHT,
    FusedOperands,
    LinearMethod,
    MethodLayer,
)
from radixserve.layers.quantization.gguf import (
    MIXED_GGUF_TYPES,
    GGUFLinearMethod,
    GGUFWeight,
    use_gguf_blocks,
)
from radixserve.layers.quantization.unquantized import UnquantizedLinearMethod

__all__ = [
    "FLOAT_WEIGHT",
    "MIXED_GGUF_TYPES",
    "FusedOperands",
    "GGUFLinearMethod",
    "GGUFWeight",
    "LinearMethod",
    "MethodLayer",
    "UnquantizedLinearMethod",
    "use_gguf_blocks",
]
