"""A plain greedy batch's logits stay in the model's dtype (StepInputs.argmax_only): a bfloat16
model's step hands the sampler bf16 logits, whose argmax is the float32 copy's (widening is
exact), so the tokens are the same with the copy made; a batch where any request wants more
than the argmax (logprobs, sampling) and a family that post-processes its logits in float32
(Gemma 2's soft cap) get float32."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve import Engine
from radixserve.managers import step_runner
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
def seen_dtypes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[torch.dtype]]:
    """The dtype of every logits tensor the step runner samples from."""
    seen: list[torch.dtype] = []
    original = step_runner.StepRunner.sample

    def spy(self: Any, reqs: Any, logits: torch.Tensor, plain_greedy: Any = None) -> Any:
        seen.append(logits.dtype)
        return original(self, reqs, logits, plain_greedy)

    monkeypatch.setattr(step_runner.StepRunner, "sample", spy)
    yield seen


def _tokens(engine: Engine, **extra: Any) -> list[list[int]]:
    outs = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY, **extra)
    return [o["output_ids"] for o in outs]


def test_greedy_batches_sample_model_dtype_logits_with_the_same_tokens(
    llama: Path, seen_dtypes: list[torch.dtype], monkeypatch: pytest.MonkeyPatch
) -> None:
    with _engine(llama) as engine:
        fast = _tokens(engine)
        assert seen_dtypes and set(seen_dtypes) == {torch.bfloat16}
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
    tmp_path: Path, seen_dtypes: list[torch.dtype]
) -> None:
    folder = tmp_path / "gemma2"
    make_tiny_checkpoint(folder, "gemma2")
    with _engine(folder) as engine:
        _tokens(engine)
    assert seen_dtypes and set(seen_dtypes) == {torch.float32}
