"""GGML tensor types as GGUF files store them: ids, block sizes and names.

One table for the loader, the layers and the kernels (the C++ side repeats the ids in
csrc/gguf_blocks.h). Values are llama.cpp's `ggml_type` ids, which GGUF files record per tensor.
"""

from __future__ import annotations

from typing import NamedTuple


class BlockFormat(NamedTuple):
    name: str
    weights: int  # weights per block
    bytes: int  # bytes per block


F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = 10, 11, 12, 13, 14
IQ4_NL, IQ4_XS, BF16 = 20, 23, 30
MXFP4 = 39  # gpt-oss experts: an E8M0 scale byte, then 32 FP4 E2M1 codes

FORMATS: dict[int, BlockFormat] = {
    F32: BlockFormat("F32", 1, 4),
    F16: BlockFormat("F16", 1, 2),
    BF16: BlockFormat("BF16", 1, 2),
    Q4_0: BlockFormat("Q4_0", 32, 18),
    Q4_1: BlockFormat("Q4_1", 32, 20),
    Q5_0: BlockFormat("Q5_0", 32, 22),
    Q5_1: BlockFormat("Q5_1", 32, 24),
    Q8_0: BlockFormat("Q8_0", 32, 34),
    Q2_K: BlockFormat("Q2_K", 256, 84),
    Q3_K: BlockFormat("Q3_K", 256, 110),
    Q4_K: BlockFormat("Q4_K", 256, 144),
    Q5_K: BlockFormat("Q5_K", 256, 176),
    Q6_K: BlockFormat("Q6_K", 256, 210),
    IQ4_NL: BlockFormat("IQ4_NL", 32, 18),
    IQ4_XS: BlockFormat("IQ4_XS", 256, 136),
    MXFP4: BlockFormat("MXFP4", 32, 17),
}

# Byte offsets of each block type's fp16 fields (the scale d, and dmin or m where the type has
# one): random bytes with these fields set to finite values make valid blocks (tests, probes).
# MXFP4 has none: its scale is a power-of-two byte (E8M0_FIELDS).
FP16_FIELDS: dict[int, tuple[int, ...]] = {
    Q4_0: (0,),
    Q4_1: (0, 2),
    Q5_0: (0,),
    Q5_1: (0, 2),
    Q8_0: (0,),
    Q2_K: (80, 82),
    Q3_K: (108,),
    Q4_K: (0, 2),
    Q5_K: (0, 2),
    Q6_K: (208,),
    IQ4_NL: (0,),
    IQ4_XS: (0,),
}

# Byte offsets of the E8M0 (power of two) scale bytes of the types that have them.
E8M0_FIELDS: dict[int, tuple[int, ...]] = {MXFP4: (0,)}

# Block types a linear layer keeps as blocks (--quantization gguf): every quantized format
# above. The C++ integer kernels run NATIVE_TYPES directly; the others are dequantized a tile of
# rows at a time (kernels.ops.gguf_linear), never stored expanded.
QUANTIZED_TYPES = frozenset(t for t, f in FORMATS.items() if f.weights > 1)
NATIVE_TYPES = frozenset(
    {Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4}
)
# Types with kernels on int8 activations per 256 (csrc/gguf_q8k.cpp), chosen at startup.
Q8K_TYPES = frozenset({Q3_K, Q4_K, Q5_K, Q6_K})
# The types the first integer kernels ran (one-call decoder layer and batch-1 chain).
LEGACY_CHAIN_TYPES = frozenset({Q4_1, Q8_0})


def type_name(qtype: int) -> str:
    fmt = FORMATS.get(qtype)
    return fmt.name if fmt is not None else f"type {qtype}"


def row_bytes(qtype: int, k: int) -> int:
    """Bytes of one row of K weights of `qtype`."""
    fmt = FORMATS[qtype]
    if k % fmt.weights:
        raise ValueError(f"{fmt.name} rows need a multiple of {fmt.weights} weights, got {k}")
    return k // fmt.weights * fmt.bytes


def whole_blocks(qtype: int, start: int, width: int) -> bool:
    """Whether weights [start, start + width) of a row of `qtype` are whole blocks (a tensor
    parallel rank's slice of a row-split layer must be)."""
    weights = FORMATS[qtype].weights
    return start % weights == 0 and width % weights == 0


def row_weights(qtype: int, nbytes: int) -> int:
    """K of a row of `nbytes` bytes of `qtype` blocks (row_bytes' inverse)."""
    fmt = FORMATS[qtype]
    return nbytes // fmt.bytes * fmt.weights
