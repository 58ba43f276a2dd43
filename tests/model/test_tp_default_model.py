"""The real default model (SmolLM2-135M: 9 query heads, 3 KV heads) with --tp-size 3 gives the
same greedy tokens as one rank. Both run torch_native attention and float32; the row-parallel
projections sum their partial products in another order, so the logits differ in the last
bits and a divergence would show only at a near tie (none on these prompts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixserve import Engine

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
]
GREEDY = {"temperature": 0, "max_new_tokens": 16}


@pytest.mark.slow
def test_default_model_tp3_equals_tp1(default_gguf: Path) -> None:
    kwargs = {
        "model_path": str(default_gguf),
        "dtype": "float32",
        "quantization": "unquant",  # both: --tp-size 3 cannot run the GGUF blocks
        "attention_backend": "torch_native",
        "max_total_tokens": 4096,
    }
    with Engine(runtime="thread", **kwargs) as single:
        expected = [r["output_ids"] for r in single.generate(PROMPTS, GREEDY)]
    with Engine(tp_size=3, dist_timeout=120, **kwargs) as engine:
        got = [r["output_ids"] for r in engine.generate(PROMPTS, GREEDY)]
    assert got == expected


@pytest.mark.slow
def test_default_model_on_its_blocks_tp3_equals_tp1(default_gguf: Path) -> None:
    """The Q4_1 blocks cut over 3 ranks (576 / 3 = 192 and 1,536 / 3 = 512 input columns: whole
    blocks of 32): the same greedy tokens as one rank on the whole blocks. In float32: with
    bfloat16 activations (the default dtype on AMX/AVX512-BF16 hosts) the third prompt's sixth
    token is a one-ulp tie of the bf16 logits (logprobs -1.2665 vs -1.3290), which the ranks'
    other summation order flips."""
    kwargs = {"model_path": str(default_gguf), "dtype": "float32", "max_total_tokens": 4096}
    with Engine(runtime="thread", **kwargs) as single:
        expected = [r["output_ids"] for r in single.generate(PROMPTS, GREEDY)]
    with Engine(tp_size=3, dist_timeout=120, **kwargs) as engine:
        assert engine.server_args.quantization == "gguf"
        got = [r["output_ids"] for r in engine.generate(PROMPTS, GREEDY)]
    assert got == expected
