"""--enable-torch-compile on the real default model (float32): greedy output equals the eager
fast path's. Slow: inductor compiles the 30-layer decode graph for a few minutes on 2 cores (the
first time; the on-disk cache makes later runs faster)."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixserve import Engine

GREEDY = {"temperature": 0, "max_new_tokens": 16}
# Decoded together: 3 requests padded to the one bucket (4).
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
]


def _greedy(default_gguf: Path, **options: object) -> list[list[int]]:
    with Engine(
        model_path=str(default_gguf),
        dtype="float32",
        quantization="unquant",
        max_total_tokens=4096,
        runtime="thread",
        **options,
    ) as eng:
        results = eng.generate(prompt=PROMPTS, sampling_params=GREEDY)
    return [r["output_ids"] for r in results]


@pytest.mark.slow
def test_compiled_decode_equals_eager(default_gguf: Path) -> None:
    eager = _greedy(default_gguf)
    compiled = _greedy(
        default_gguf,
        enable_torch_compile=True,
        torch_compile_max_bs=4,
        cuda_graph_bs=[4],
    )
    assert compiled == eager
