"""The engine's greedy output on the real default model equals HF transformers', token for token
(float32), whether requests run alone or batched, with the radix cache on or off, and with a
chunked-prefill size that splits every prompt. These engines run the default CPU kernels (the
fused C++ ones, whose float32 sums are ordered differently from PyTorch's), so a divergence is
accepted only where the reference model's top two logits are a near tie at that position; the
exact torch_native path and the quantized path are checked in test_fast_paths.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from radixserve import Engine
from tests.helpers.hf_reference import hf_logits
from tests.helpers.vs_hf_prompts import VS_HF_MAX_NEW

MAX_NEW = VS_HF_MAX_NEW
CHUNK = 6
TIE_GAP = 1e-3
GREEDY = {"temperature": 0, "max_new_tokens": MAX_NEW}


@pytest.fixture(scope="module")
def engine(default_gguf: Path) -> Iterator[Engine]:
    with Engine(
        model_path=str(default_gguf),
        dtype="float32",
        quantization="unquant",  # the exact float path (a .gguf runs quantized by default)
        max_total_tokens=16384,
    ) as eng:
        yield eng


@pytest.fixture(scope="module")
def prompt_ids(vs_hf_prompts: list[list[int]]) -> list[list[int]]:
    return vs_hf_prompts


@pytest.fixture(scope="module")
def reference(vs_hf_reference: list[list[int]]) -> list[list[int]]:
    return vs_hf_reference


def assert_matches_reference(
    hf_model: Any, prompts: list[list[int]], ours: list[list[int]], ref: list[list[int]]
) -> None:
    for prompt, got, want in zip(prompts, ours, ref, strict=True):
        if got == want:
            continue
        i = next((k for k, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
        assert i is not None, f"same prefix but different lengths: {got} vs {want}"
        logits = hf_logits(hf_model, prompt + want[:i])[-1]
        top2 = logits.topk(2).values
        gap = float(top2[0] - top2[1])
        assert gap < TIE_GAP, f"diverged at token {i} without a near tie (gap {gap:.4g})"


def run_alone(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    return [engine.generate(input_ids=p, sampling_params=GREEDY)["output_ids"] for p in prompts]


def run_batch(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    return [r["output_ids"] for r in engine.generate(input_ids=prompts, sampling_params=GREEDY)]


def test_greedy_alone_and_batched_match_hf(
    engine: Engine, prompt_ids: list[list[int]], reference: list[list[int]], hf_default_model: Any
) -> None:
    engine.flush_cache()
    # Every prompt batched; one by one, a third of them (the batch already runs each prompt's
    # own rows; alone, the 20 sequential generations cost a minute on 2 cores).
    few = slice(0, max(1, len(prompt_ids) // 3))
    alone = run_alone(engine, prompt_ids[few])
    assert_matches_reference(hf_default_model, prompt_ids[few], alone, reference[few])
    batched = run_batch(engine, prompt_ids)  # now also hitting the prefix cache
    assert_matches_reference(hf_default_model, prompt_ids, batched, reference)


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"disable_radix_cache": True}, marks=pytest.mark.slow),
        {"chunked_prefill_size": CHUNK},
    ],
    ids=["radix-off", f"chunked-{CHUNK}"],
)
def test_greedy_matches_hf_across_cache_and_chunking(
    default_gguf: Path,
    options: dict[str, Any],
    prompt_ids: list[list[int]],
    reference: list[list[int]],
    hf_default_model: Any,
) -> None:
    # Every other prompt (chats and plain texts alike): the cache and chunking paths do not
    # depend on the text, and 6-token chunks of all 20 prompts cost a minute on 2 cores.
    prompt_ids, reference = prompt_ids[::2], reference[::2]
    with Engine(
        model_path=str(default_gguf),
        dtype="float32",
        quantization="unquant",
        max_total_tokens=16384,
        **options,
    ) as eng:
        batched = run_batch(eng, prompt_ids)
        assert_matches_reference(hf_default_model, prompt_ids, batched, reference)
        info = eng.get_server_info()
        assert info["available_kv_tokens"] + info["cached_tokens"] == info["max_total_num_tokens"]


def test_shared_prefix_hits_the_cache_and_computes_less(engine: Engine) -> None:
    engine.flush_cache()
    system = "You are a helpful assistant who answers briefly and precisely. " * 4
    questions = ["What is 2+2?", "Name a color.", "Say hi.", "Name a fruit."]
    before = engine.get_server_info()
    results = engine.generate([system + q for q in questions[:1]], GREEDY)
    results += engine.generate([system + q for q in questions[1:]], GREEDY)
    after = engine.get_server_info()
    cached = [r["meta_info"]["cached_tokens"] for r in results]
    assert cached[0] == 0 and all(c > 20 for c in cached[1:])
    prompt_total = sum(r["meta_info"]["prompt_tokens"] for r in results)
    computed = after["prefill_tokens_total"] - before["prefill_tokens_total"]
    assert computed == prompt_total - sum(cached)


def test_text_prompt_and_stop_string(engine: Engine) -> None:
    prompt = "Count from one to ten: one, two, three,"
    params = {**GREEDY, "stop": [" seven", "never-seen"]}
    out = engine.generate(prompt, params)
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": " seven"}
    assert out["text"] == " four, five, six,"
    streamed = "".join(c["text"] for c in engine.generate(prompt, params, stream=True))
    assert streamed == out["text"]
    kept = engine.generate(prompt, {**params, "no_stop_trim": True})
    assert kept["text"] == " four, five, six, seven"


def test_stop_regex_ends_the_request_streamed_or_not(engine: Engine) -> None:
    prompt = "Count from one to ten: one, two, three,"
    params = {**GREEDY, "stop_regex": [r"\bs[a-z]+,", "never-seen"]}
    out = engine.generate(prompt, params)
    # SGLang reports the pattern; the matched text stays in the output.
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": r"\bs[a-z]+,"}
    assert out["text"] == " four, five, six,"
    chunks = list(engine.generate(prompt, params, stream=True))
    assert "".join(c["text"] for c in chunks) == out["text"]
    assert chunks[-1]["meta_info"]["finish_reason"] == out["meta_info"]["finish_reason"]
