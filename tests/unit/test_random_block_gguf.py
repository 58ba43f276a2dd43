"""benchmarks/random_block_gguf.py: llama-quantize's Q4_K_M type choice per tensor, and random
blocks that dequantize to small, centred, finite weights with normal (not subnormal) scales."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from random_block_gguf import q4_k_m_type, random_block_bytes


def test_q4_k_m_types_follow_llama_quantize() -> None:
    """The pattern llama-quantize wrote into the moe-1b file (24 layers): attn_v and
    ffn_down_exps Q6_K on the first and last eighth and every third layer between."""
    pattern = "".join(
        "6" if q4_k_m_type(f"blk.{i}.ffn_down_exps.weight", True, 24) == "Q6_K" else "4"
        for i in range(24)
    )
    assert pattern == "666446446446446446446666"
    assert q4_k_m_type("blk.4.attn_v.weight", True, 24) == "Q4_K"
    assert q4_k_m_type("blk.5.attn_v.weight", True, 24) == "Q6_K"
    assert q4_k_m_type("blk.5.attn_q.weight", True, 24) == "Q4_K"
    assert q4_k_m_type("token_embd.weight", True, 24) == "Q6_K"  # tied: it is the LM head
    assert q4_k_m_type("token_embd.weight", False, 24) == "Q4_K"
    assert q4_k_m_type("output.weight", False, 24) == "Q6_K"


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_random_blocks_are_small_centred_weights(qtype: str) -> None:
    import gguf

    blocks = random_block_bytes(qtype, 64, 512, np.random.default_rng(0))
    kind = gguf.GGMLQuantizationType[qtype]
    weights = gguf.quants.dequantize(blocks, kind)
    assert weights.shape == (64, 512) and np.isfinite(weights).all()
    assert abs(float(weights.mean())) < 0.01 and 0.005 < float(weights.std()) < 0.15
    per_block = gguf.GGML_QUANT_SIZES[kind][1]
    d_offset = 0 if qtype == "Q4_K" else 208
    d = blocks.reshape(-1, per_block)[:, d_offset : d_offset + 2].copy().view(np.float16)
    assert (np.abs(d.astype(np.float32)) >= np.finfo(np.float16).tiny).all()  # not subnormal
