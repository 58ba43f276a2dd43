"""A plain greedy batch is answered with each row's argmax (StepInputs.argmax_only): the model
reduces its logits in its own dtype (ForwardOutput.greedy_tokens; a bfloat16 model's argmax is
the float32 copy's, widening being exact), so the tokens are the same as with float32 logits
sampled; a batch where any request wants more than the argmax (logprobs, sampling) and a family
that post-processes its logits in float32 (Gemma 2's soft cap) get float32 logits. On the
default model (a Q8_0 LM head) in bfloat16 the head's argmax is the fused GGUF kernel where the
AMX tiles run, and gives the tokens the written logits give."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve import Engine
from radixserve.managers import step_runner
from radixserve.model_executor.model_runner import ModelRunner
from tests.helpers.tiny_models import make_tiny_checkpoint

GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
PROMPTS = [[5, 9, 14, 3], [7, 7, 21, 30, 2, 11], [40, 41]]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-argmax-only")
    make_tiny_checkpoint(folder, "llama", num_key_value_heads=2)
    return folder


def _engine(folder: Path) -> Engine:
    return Engine(
        model_path=str(folder),
        dtype="bfloat16",
        skip_tokenizer_init=True,
        max_total_tokens=2048,
        random_seed=0,
        runtime="thread",
    )


@pytest.fixture
def seen_dtypes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Per step with logits rows, what the runner answered with: the logits' dtype, or
    "tokens" (greedy tokens, no logits)."""
    seen: list[Any] = []
    original = ModelRunner._logits

    def spy(self: Any, step: Any, hidden: torch.Tensor) -> Any:
        logits, tokens = original(self, step, hidden)
        seen.append("tokens" if logits is None else logits.dtype)
        return logits, tokens

    monkeypatch.setattr(ModelRunner, "_logits", spy)
    yield seen


def _tokens(engine: Engine, **extra: Any) -> list[list[int]]:
    outs = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY, **extra)
    return [o["output_ids"] for o in outs]


def test_greedy_batches_sample_model_dtype_logits_with_the_same_tokens(
    llama: Path, seen_dtypes: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    with _engine(llama) as engine:
        fast = _tokens(engine)
        assert seen_dtypes and set(seen_dtypes) == {"tokens"}
        seen_dtypes.clear()
        # Asking for logprobs needs the float32 logits: every step of that batch gets them.
        with_logprobs = _tokens(engine, return_logprob=True)
        assert set(seen_dtypes) == {torch.float32}
        seen_dtypes.clear()
        # The same greedy batch with the float32 copy made, as before argmax_only.
        monkeypatch.setattr(step_runner, "_argmax_only", lambda reqs: False)
        copied = _tokens(engine)
        assert set(seen_dtypes) == {torch.float32}
    assert fast == copied == with_logprobs


def test_a_family_that_post_processes_logits_keeps_float32(
    tmp_path: Path, seen_dtypes: list[Any]
) -> None:
    folder = tmp_path / "gemma2"
    make_tiny_checkpoint(folder, "gemma2")
    with _engine(folder) as engine:
        _tokens(engine)
    assert seen_dtypes and set(seen_dtypes) == {torch.float32}
