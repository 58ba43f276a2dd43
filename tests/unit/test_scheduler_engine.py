"""The engine on a tiny random model: batching, chunking, caching and retraction must not change
greedy outputs, and KV memory is conserved through every path."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from radixserve import Engine
from tests.unit.tiny_model import TINY_VOCAB, make_tiny_engine, tiny_engines, write_tiny_llama

GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


make_engine = make_tiny_engine


@pytest.fixture
def engine_factory(tiny_model_dir: Path) -> Iterator[Any]:
    with tiny_engines(tiny_model_dir) as factory:
        yield factory


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, TINY_VOCAB) for _ in range(rng.randint(5, 60))] for _ in range(count)]


def assert_kv_idle(engine: Engine) -> None:
    info = engine.get_server_info()
    assert info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0
    assert info["available_kv_tokens"] + info["cached_tokens"] == info["max_total_num_tokens"]


def test_greedy_is_independent_of_batching_chunking_and_cache(engine_factory: Any) -> None:
    inputs = prompts(8)
    base = engine_factory()
    alone = [base.generate(input_ids=p, sampling_params=GREEDY)["output_ids"] for p in inputs]
    batched = [r["output_ids"] for r in base.generate(input_ids=inputs, sampling_params=GREEDY)]
    assert batched == alone
    assert_kv_idle(base)
    for kwargs in (
        {"disable_radix_cache": True},
        {"chunked_prefill_size": 8},
        {"page_size": 4},
        {"schedule_policy": "lpm"},
        {"enable_mixed_chunk": True, "chunked_prefill_size": 16},
    ):
        other = engine_factory(**kwargs)
        got = [r["output_ids"] for r in other.generate(input_ids=inputs, sampling_params=GREEDY)]
        assert got == alone, kwargs
        assert_kv_idle(other)


def test_shared_prefix_reports_cached_tokens(engine_factory: Any) -> None:
    engine = engine_factory()
    prefix = prompts(1, seed=3)[0] * 2
    first = engine.generate(input_ids=prefix + [7, 8], sampling_params=GREEDY)
    second = engine.generate(input_ids=prefix + [9, 10], sampling_params=GREEDY)
    assert first["meta_info"]["cached_tokens"] == 0
    assert second["meta_info"]["cached_tokens"] >= len(prefix)
    off = engine_factory(disable_radix_cache=True)
    off.generate(input_ids=prefix + [7, 8], sampling_params=GREEDY)
    again = off.generate(input_ids=prefix + [9, 10], sampling_params=GREEDY)
    assert again["meta_info"]["cached_tokens"] == 0


def test_retraction_under_a_tiny_pool_keeps_outputs(engine_factory: Any) -> None:
    inputs = prompts(16, seed=5)
    params = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
    roomy = engine_factory()
    expected = [r["output_ids"] for r in roomy.generate(input_ids=inputs, sampling_params=params)]
    tight = engine_factory(max_total_tokens=256)
    results = tight.generate(input_ids=inputs, sampling_params=params)
    assert [r["output_ids"] for r in results] == expected
    assert all(r["meta_info"]["finish_reason"]["type"] == "length" for r in results)
    assert sum(r["meta_info"]["num_retractions"] for r in results) > 0
    assert_kv_idle(tight)


def test_request_that_can_never_fit_is_refused(engine_factory: Any) -> None:
    engine = engine_factory(max_total_tokens=64)
    result = engine.generate(input_ids=list(range(3, 53)), sampling_params={"max_new_tokens": 30})
    reason = result["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and "KV cache" in reason["message"]
    ok = engine.generate(input_ids=[5, 6, 7], sampling_params=GREEDY)
    assert len(ok["output_ids"]) == GREEDY["max_new_tokens"]


def test_abort_mid_stream_frees_kv(engine_factory: Any) -> None:
    engine = engine_factory()
    stream = engine.generate(
        input_ids=prompts(1)[0],
        sampling_params={"max_new_tokens": 200, "ignore_eos": True},
        stream=True,
    )
    first = next(stream)
    assert first["meta_info"]["finish_reason"] is None
    stream.close()  # the consumer walks away: the engine aborts the request
    engine.generate(input_ids=[5, 6, 7], sampling_params=GREEDY)  # the engine still serves
    assert_kv_idle(engine)


def test_abort_by_rid_ends_request_with_abort(engine_factory: Any) -> None:
    engine = engine_factory()
    stream = engine.generate(
        input_ids=prompts(1)[0],
        sampling_params={"max_new_tokens": 500, "ignore_eos": True},
        stream=True,
        rid="victim",
    )
    next(stream)
    engine.abort_request("victim")
    chunks = list(stream)
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert_kv_idle(engine)


def test_seeded_sampling_is_reproducible_across_batches(engine_factory: Any) -> None:
    engine = engine_factory()
    params = {"temperature": 1.0, "max_new_tokens": 10, "sampling_seed": 1234, "ignore_eos": True}
    inputs = prompts(4, seed=9)
    alone = engine.generate(input_ids=inputs[0], sampling_params=params)["output_ids"]
    batch = engine.generate(input_ids=inputs, sampling_params=params)
    assert batch[0]["output_ids"] == alone


def test_n_samples_share_the_prompt_prefix(engine_factory: Any) -> None:
    engine = engine_factory()
    prompt = prompts(1, seed=11)[0]
    results = engine.generate(
        input_ids=prompt, sampling_params={"n": 3, "max_new_tokens": 5, "temperature": 1.0}
    )
    assert len(results) == 3
    # One copy prefills; the others wait a round and find the prompt in the cache.
    cached = sorted(r["meta_info"]["cached_tokens"] for r in results)
    assert cached[0] == 0 and all(c >= len(prompt) - 1 for c in cached[1:])


def test_stop_token_ids_and_max_new_tokens_zero(engine_factory: Any) -> None:
    engine = engine_factory()
    prompt = prompts(1, seed=2)[0]
    full = engine.generate(input_ids=prompt, sampling_params=GREEDY)["output_ids"]
    stop_at = full[3]
    stopped = engine.generate(
        input_ids=prompt, sampling_params={**GREEDY, "stop_token_ids": [stop_at]}
    )
    assert stopped["output_ids"] == full[: full.index(stop_at) + 1]
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_at}
    zero = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 0})
    assert zero["output_ids"] == [] and zero["meta_info"]["finish_reason"]["type"] == "length"


def test_bad_requests_raise_clear_errors(engine_factory: Any) -> None:
    engine = engine_factory()
    with pytest.raises(ValueError, match="temperature"):
        engine.generate(input_ids=[5, 6], sampling_params={"temperature": -1})
    with pytest.raises(ValueError, match="vocabulary"):
        engine.generate(input_ids=[5, TINY_VOCAB + 10], sampling_params=GREEDY)
    with pytest.raises(ValueError, match="stream=True takes a single prompt"):
        engine.generate(input_ids=[[5, 6], [7, 8]], sampling_params=GREEDY, stream=True)
    with pytest.raises(ValueError, match="context length"):
        engine.generate(input_ids=[5] * 2000, sampling_params=GREEDY)
    assert len(engine.generate(input_ids=[5, 6], sampling_params=GREEDY)["output_ids"]) == 12


def test_token_ids_logprob_reports_the_named_ids(engine_factory: Any) -> None:
    # SGLang's token_ids_logprob: meta_info["output_token_ids_logprobs"] holds, per output
    # position, [logprob, token id, text] for each named id, in the order given.
    engine = engine_factory()
    wanted = [5, 9, 3]
    prompt = prompts(1, seed=5)[0]
    result = engine.generate(
        input_ids=prompt,
        sampling_params=GREEDY,
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=1,
        token_ids_logprob=wanted,
    )
    meta = result["meta_info"]
    # Prompt positions too (input_token_ids_logprobs); the first token has none, as in SGLang.
    inputs = meta["input_token_ids_logprobs"]
    assert len(inputs) == len(prompt) and inputs[0] is None
    for entries, (lp, tid, _) in zip(inputs[1:], meta["input_token_logprobs"][1:], strict=True):
        assert [e[1] for e in entries] == wanted
        assert all(abs(e[0] - lp) < 1e-5 for e in entries if e[1] == tid)
    per_position = meta["output_token_ids_logprobs"]
    assert len(per_position) == GREEDY["max_new_tokens"]
    for entries, (chosen_lp, chosen, _), top in zip(
        per_position, meta["output_token_logprobs"], meta["output_top_logprobs"], strict=True
    ):
        assert [e[1] for e in entries] == wanted
        assert all(e[0] <= top[0][0] + 1e-5 for e in entries)  # none above the greedy top
        for lp, tid, _ in entries:
            if tid == chosen:
                assert abs(lp - chosen_lp) < 1e-5
    plain = engine.generate(input_ids=[5, 6], sampling_params=GREEDY, return_logprob=True)
    assert "output_token_ids_logprobs" not in plain["meta_info"]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.generate(input_ids=[5, 6], return_logprob=True, token_ids_logprob=[TINY_VOCAB])


def test_input_logprobs_cover_the_prompt(engine_factory: Any) -> None:
    engine = engine_factory()
    prompt = prompts(1, seed=4)[0]
    result = engine.generate(
        input_ids=prompt,
        sampling_params=GREEDY,
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=2,
    )
    meta = result["meta_info"]
    assert len(meta["input_token_logprobs"]) == len(prompt)
    assert meta["input_token_logprobs"][0][0] is None
    assert all(lp <= 0 for lp, _, _ in meta["input_token_logprobs"][1:])
    assert len(meta["output_token_logprobs"]) == GREEDY["max_new_tokens"]
    for (lp, tid, _), top in zip(
        meta["output_token_logprobs"], meta["output_top_logprobs"], strict=True
    ):
        assert top[0][1] == tid and abs(top[0][0] - lp) < 1e-5  # greedy picks the top token


def test_async_generate_and_stream(engine_factory: Any) -> None:
    import asyncio

    engine = engine_factory()
    inputs = prompts(3, seed=21)
    expected = [r["output_ids"] for r in engine.generate(input_ids=inputs, sampling_params=GREEDY)]

    async def main() -> tuple[list[list[int]], list[int]]:
        results = await engine.async_generate(input_ids=inputs, sampling_params=GREEDY)
        stream = await engine.async_generate(
            input_ids=inputs[0], sampling_params=GREEDY, stream=True
        )
        streamed: list[int] = []
        async for chunk in stream:
            streamed.extend(chunk["output_ids"])
        return [r["output_ids"] for r in results], streamed

    batch, streamed = asyncio.run(main())
    assert batch == expected and streamed == expected[0]


def test_a_failed_step_ends_requests_once_and_the_engine_recovers(engine_factory: Any) -> None:
    engine = engine_factory()
    runner = engine.scheduler.runner
    real_forward = runner.forward
    calls = {"n": 0}

    def flaky_forward(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:  # fail in the middle of decoding
            raise RuntimeError("injected failure")
        return real_forward(*args, **kwargs)

    runner.forward = flaky_forward
    results = engine.generate(input_ids=prompts(4, seed=8), sampling_params=GREEDY)
    reasons = [r["meta_info"]["finish_reason"] for r in results]
    assert all(r["type"] == "abort" and r["status_code"] == 500 for r in reasons)
    ok = engine.generate(input_ids=[5, 6, 7], sampling_params=GREEDY)
    assert ok["meta_info"]["finish_reason"]["type"] == "length"
    assert_kv_idle(engine)


def test_encode_needs_an_embedding_server(engine_factory: Any) -> None:
    engine = engine_factory()
    with pytest.raises(ValueError, match="embedding"):
        engine.encode(input_ids=[5, 6, 7])
    embedder = engine_factory(is_embedding=True)
    out = embedder.encode(input_ids=[[5, 6, 7], [8, 9, 10, 11]])
    assert [len(r["embedding"]) for r in out] == [64, 64]
    assert out[0]["embedding"] != out[1]["embedding"]
    assert_kv_idle(embedder)


def test_async_n_samples_share_the_prompt_prefix(engine_factory: Any) -> None:
    import asyncio

    engine = engine_factory()
    prompt = prompts(1, seed=13)[0]

    async def main() -> Any:
        return await engine.async_generate(
            input_ids=prompt, sampling_params={"n": 3, "max_new_tokens": 4, "temperature": 1.0}
        )

    results = asyncio.run(main())
    assert len(results) == 3
    # One copy prefills; the others wait a round and find the prompt in the cache.
    cached = sorted(r["meta_info"]["cached_tokens"] for r in results)
    assert cached[0] == 0 and all(c >= len(prompt) - 1 for c in cached[1:])
    assert_kv_idle(engine)


def test_running_request_shares_its_prefix_while_decoding(engine_factory: Any) -> None:
    """cache_unfinished: a prompt's KV enters the prefix cache when its prefill completes,
    not when the request finishes, so a request arriving mid-decode reuses it."""
    engine = engine_factory()
    prefix = prompts(1, seed=21)[0] * 2
    params = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
    stream = engine.generate(input_ids=prefix + [5], sampling_params=params, stream=True)
    next(stream)  # the first token is out: its prefill is done
    other = engine.generate(input_ids=prefix + [6, 7], sampling_params=GREEDY)
    assert other["meta_info"]["cached_tokens"] >= len(prefix)
    chunks = list(stream)
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert_kv_idle(engine)


def test_same_batch_shared_prefix_is_computed_once(engine_factory: Any) -> None:
    engine = engine_factory()
    system = [3 + (i * 7) % 400 for i in range(40)]  # longer than IN_BATCH_PREFIX_TOKENS
    batch = [system + [410 + i, 411 + i] for i in range(4)]
    before = engine.get_server_info()
    results = engine.generate(input_ids=batch, sampling_params=GREEDY)
    after = engine.get_server_info()
    cached = sorted(r["meta_info"]["cached_tokens"] for r in results)
    assert cached[0] == 0 and all(c == len(system) for c in cached[1:]), cached
    computed = after["prefill_tokens_total"] - before["prefill_tokens_total"]
    assert computed == sum(len(p) for p in batch) - sum(cached)
    assert_kv_idle(engine)
