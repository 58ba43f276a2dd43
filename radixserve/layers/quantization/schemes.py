"""The quantize-on-load choices of --quantization (on_load.py): which block format a float
weight becomes.

- w8a8_int8: int8 with one scale per block of 32 weights (Q8_0). Per-block scales are finer
  than SGLang's per-channel int8, so the error stays near 0.2% of each block's maximum.
- bitsandbytes: 4-bit, SGLang's in-flight 4-bit quantization of a float checkpoint. Here the
  blocks are Q4_K (min-max per 32 weights, 6-bit scales per 256; 4.5 bits a weight) where the
  input size is a multiple of 256, else Q4_1 (min-max per 32 with fp16 step and minimum; 5
  bits a weight), not bitsandbytes' NF4 codebook (docs/options.md).
"""

from __future__ import annotations

import torch

from radixserve.kernels import gguf_types as gt
from radixserve.kernels.block_quantize import in_row_chunks, q4_1_blocks, q4_k_blocks, q8_0_blocks
from radixserve.layers.quantization.on_load import OnLoadScheme

_Q4_K_WEIGHTS = gt.FORMATS[gt.Q4_K].weights  # weights per Q4_K super-block (256)


def _int8(weight: torch.Tensor) -> tuple[torch.Tensor, int]:
    return in_row_chunks(q8_0_blocks, weight), gt.Q8_0


def _four_bit(weight: torch.Tensor) -> tuple[torch.Tensor, int]:
    # Q4_K needs whole super-blocks of 256 along K (SmolLM2-135M's 576 is not: Q4_1 there, as
    # llama.cpp falls back to another type for such tensors). Both run on the integer kernels.
    if weight.shape[1] % _Q4_K_WEIGHTS == 0:
        return in_row_chunks(q4_k_blocks, weight), gt.Q4_K
    return in_row_chunks(q4_1_blocks, weight), gt.Q4_1


SCHEMES: dict[str, OnLoadScheme] = {
    "w8a8_int8": OnLoadScheme("w8a8_int8", _int8, block=32),
    "bitsandbytes": OnLoadScheme("bitsandbytes", _four_bit, block=32),
}
