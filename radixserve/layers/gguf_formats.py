"""The GGUF block-type facts a model loader needs (models/ may import layers/, not kernels/)."""

from __future__ import annotations

import torch

from radixserve.kernels import gguf_dequant, gguf_types, ops

FORMATS = gguf_types.FORMATS  # type -> BlockFormat(name, weights, bytes)
QUANTIZED_TYPES = gguf_types.QUANTIZED_TYPES
SUPPORTED_TYPES = frozenset(gguf_types.FORMATS)  # every type the loader reads
type_name = gguf_types.type_name
whole_blocks = gguf_types.whole_blocks
MXFP4 = gguf_types.MXFP4  # gpt-oss experts, from a GGUF file or an mxfp4 safetensors checkpoint


def dequantize(data: torch.Tensor, qtype: int, shape: tuple[int, ...]) -> torch.Tensor:
    """GGUF tensor bytes of `qtype` -> float32 tensor of `shape`."""
    return gguf_dequant.dequantize(data, qtype, shape)


def runs_on_integer_kernels(qtype: int) -> bool:
    """Whether the C++ kernels multiply `qtype` blocks directly (else tiles are dequantized)."""
    return ops.gguf_kernel_type(qtype)
