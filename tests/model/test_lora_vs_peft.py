"""Multi-LoRA on the real default model (SmolLM2-135M, float32): PEFT adapters with random
non-zero weights, saved as PEFT folders and loaded at run time; each adapter's greedy output
equals HF transformers + PEFT token for token, alone and with two adapters and the base model
in one batch. The torch_native backend keeps every op the PyTorch reference; a divergence is
accepted only at a near tie of the reference's top two logits (our q|k|v and gate|up deltas are
one stacked matmul where PEFT runs one per projection, so sums may round differently)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

pytest.importorskip("peft")

from radixserve import Engine
from tests.helpers.hf_reference import hf_greedy, hf_logits
from tests.helpers.lora_adapters import AdapterRef, make_peft_adapter
from tests.helpers.vs_hf_prompts import vs_hf_prompt_ids

# Slow: HF + PEFT generation and a process engine on the real model (minutes on 2 loaded cores).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

MAX_NEW = 12
NUM_PROMPTS = 3
TIE_GAP = 1e-3
GREEDY = {"temperature": 0, "max_new_tokens": MAX_NEW}


class Refs(NamedTuple):
    prompts: list[list[int]]
    base: list[list[int]]
    a: AdapterRef
    b: AdapterRef


@pytest.fixture(scope="module")
def engine(default_gguf: Path) -> Iterator[Engine]:
    with Engine(
        model_path=str(default_gguf),
        dtype="float32",
        quantization="unquant",  # PEFT runs the float weights
        max_total_tokens=8192,
        attention_backend="torch_native",
        enable_lora=True,
        max_lora_rank=16,
    ) as eng:
        yield eng


@pytest.fixture(scope="module")
def refs(engine: Engine, hf_default_model: Any, tmp_path_factory: pytest.TempPathFactory) -> Refs:
    root = tmp_path_factory.mktemp("default-lora")
    prompts = vs_hf_prompt_ids(engine.tokenizer)[:NUM_PROMPTS]
    eos = [engine.tokenizer.eos_token_id]
    base = [hf_greedy(hf_default_model, p, MAX_NEW, stop_ids=eos) for p in prompts]
    a = make_peft_adapter(
        hf_default_model,
        root / "a",
        prompts,
        MAX_NEW,
        rank=8,
        alpha=16,
        seed=1,
        scale=0.03,
        stop_ids=eos,
    )
    b = make_peft_adapter(
        hf_default_model,
        root / "b",
        prompts,
        MAX_NEW,
        rank=16,
        alpha=8,
        seed=2,
        scale=0.03,
        targets=("q_proj", "v_proj", "o_proj", "down_proj"),
        use_rslora=True,
        stop_ids=eos,
    )
    assert a.greedy != base and b.greedy != base and a.greedy != b.greedy
    engine.lora.allowed_dirs = (root.resolve(),)
    engine.load_lora_adapter("a", str(a.path))
    engine.load_lora_adapter("b", str(b.path))
    return Refs(prompts, base, a, b)


def assert_matches(
    hf_model: Any,
    adapter: Path | None,
    prompts: list[list[int]],
    got: list[list[int]],
    want: list[list[int]],
) -> None:
    """Equal, or diverging only where HF + PEFT's top two logits are a near tie."""
    for prompt, ours, ref in zip(prompts, got, want, strict=True):
        if ours == ref:
            continue
        i = next((k for k, (x, y) in enumerate(zip(ours, ref, strict=False)) if x != y), None)
        assert i is not None, f"same prefix, different lengths: {ours} vs {ref}"
        model = hf_model
        if adapter is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(hf_model, str(adapter)).eval()
        try:
            top2 = hf_logits(model, prompt + ref[:i])[-1].topk(2).values
        finally:
            if adapter is not None:
                model.unload()
        gap = float(top2[0] - top2[1])
        assert gap < TIE_GAP, f"diverged at token {i} without a near tie (gap {gap:.4g})"


def test_each_adapter_alone_equals_hf_peft(
    engine: Engine, refs: Refs, hf_default_model: Any
) -> None:
    cases = (("a", refs.a), ("b", refs.b), (None, None))
    for name, ref in cases:
        got = [
            engine.generate(input_ids=p, sampling_params=GREEDY, lora_path=name)["output_ids"]
            for p in refs.prompts
        ]
        want = refs.base if ref is None else ref.greedy
        path = None if ref is None else ref.path
        assert_matches(hf_default_model, path, refs.prompts, got, want)


def test_mixed_batch_equals_hf_peft(engine: Engine, refs: Refs, hf_default_model: Any) -> None:
    """Every prompt under a, b and the base model, interleaved, in one generate call."""
    names = ["a", "b", None] * NUM_PROMPTS
    prompts = [p for p in refs.prompts for _ in range(3)]
    out = engine.generate(input_ids=prompts, sampling_params=GREEDY, lora_path=names)
    got = [o["output_ids"] for o in out]
    for k, ref in enumerate((refs.a, refs.b, None)):
        want = refs.base if ref is None else ref.greedy
        path = None if ref is None else ref.path
        assert_matches(hf_default_model, path, refs.prompts, got[k::3], want)
