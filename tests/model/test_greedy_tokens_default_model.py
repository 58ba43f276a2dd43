"""The default model's greedy batches in bfloat16 are answered by its LM head's argmax
(ForwardOutput.greedy_tokens): the Q8_0 head's ops.gguf_linear_argmax, which on an AMX host keeps
the argmax while the tiles are written and never writes the [rows, 49,152] logits. The tokens
must be those of the same batches sampled from the written logits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from radixserve import Engine
from radixserve.kernels import ops
from radixserve.managers import step_runner

GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
# Eight requests: the decode batch has 8 rows, which on an AMX host takes the tiles (from 5).
PROMPTS = [[(13 * i + 7 * j) % 900 + 20 for j in range(6 + i)] for i in range(8)]


def test_greedy_tokens_equal_the_written_logits_argmax(
    default_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    head_rows: list[int] = []
    fused = ops.gguf_linear_argmax

    def counting(x: Any, *args: Any) -> Any:
        head_rows.append(x.shape[0])
        return fused(x, *args)

    monkeypatch.setattr(ops, "gguf_linear_argmax", counting)
    with Engine(
        model_path=str(default_gguf),
        dtype="bfloat16",
        max_total_tokens=4096,
        runtime="thread",
        # Both runs prefill the whole prompts (a cached prefix would change the batches' shapes,
        # and bfloat16 results with them).
        disable_radix_cache=True,
    ) as engine:
        answered = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
        assert 8 in head_rows  # the decode steps of all eight went through the head's argmax
        head_rows.clear()
        monkeypatch.setattr(step_runner, "_argmax_only", lambda reqs: False)
        sampled = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
        assert head_rows == []  # float32 logits, sampled
    assert [r["output_ids"] for r in answered] == [r["output_ids"] for r in sampled]
