"""The hierarchical cache in a running engine (tiny model): greedy outputs with the host and
disk tiers equal outputs without them, prefixes evicted from the device come back from the
host tier or, after a restart, from disk, and no KV slot leaks."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from radixserve import Engine
from radixserve.mem_cache.hicache.config import FILE_STORAGE_DIR_ENV
from radixserve.options.errors import ServerArgsError
from tests.unit.tiny_model import TINY_VOCAB, tiny_engines, write_tiny_llama

GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
DEVICE_TOKENS = 512  # one 300-token document fits on the device, two do not


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def engine_factory(tiny_model_dir: Path) -> Iterator[Any]:
    with tiny_engines(tiny_model_dir, max_total_tokens=DEVICE_TOKENS) as factory:
        yield factory


def documents(count: int = 3, length: int = 300) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(3, TINY_VOCAB) for _ in range(length)] for _ in range(count)]


def ask_each_twice(engine: Engine, docs: list[list[int]]) -> list[dict[str, Any]]:
    """Each document with a short question, then all again: by the second round every
    document has been pushed off the device by the others."""
    out = []
    for rnd in range(2):
        for i, doc in enumerate(docs):
            out.append(engine.generate(input_ids=[*doc, 10 + rnd, 20 + i], sampling_params=GREEDY))
    return out


def assert_no_leak(engine: Engine) -> None:
    assert engine.flush_cache()
    info = engine.get_server_info()
    assert info["available_kv_tokens"] == info["max_total_num_tokens"]
    assert info["hicache_host_used_tokens"] == 0


@pytest.mark.parametrize("policy", ["write_through", "write_through_selective", "write_back"])
def test_outputs_with_tiers_equal_outputs_without(engine_factory: Any, policy: str) -> None:
    docs = documents()
    want = [r["output_ids"] for r in ask_each_twice(engine_factory(), docs)]
    tiered = engine_factory(enable_hierarchical_cache=True, hicache_write_policy=policy)
    got = ask_each_twice(tiered, docs)
    assert [r["output_ids"] for r in got] == want
    info = tiered.get_server_info()
    if policy == "write_through_selective":
        # Nothing was reused while on the device, so nothing earned a host copy.
        assert info["cached_tokens_host_total"] == 0
    else:
        # Second round: each document's 9 full 32-token blocks come back from the host.
        for r in got[3:]:
            assert r["meta_info"]["cached_tokens"] == 288
            assert r["meta_info"]["cached_tokens_details"] == {
                "device": 0,
                "host": 288,
                "storage": 0,
            }
        assert info["cached_tokens_host_total"] == 3 * 288
    assert info["cached_tokens_storage_total"] == 0
    assert_no_leak(tiered)


def test_selective_write_through_keeps_reused_prefixes(engine_factory: Any) -> None:
    docs = documents()
    engine = engine_factory(
        enable_hierarchical_cache=True, hicache_write_policy="write_through_selective"
    )
    ask = [*docs[0], 10, 11]
    engine.generate(input_ids=ask, sampling_params=GREEDY)
    engine.generate(input_ids=ask, sampling_params=GREEDY)  # device hit: earns a host copy
    for doc in docs[1:]:
        engine.generate(input_ids=[*doc, 10, 11], sampling_params=GREEDY)
    again = engine.generate(input_ids=ask, sampling_params=GREEDY)
    assert again["meta_info"]["cached_tokens_details"]["host"] == 288


def test_write_back_copies_only_on_device_eviction(engine_factory: Any) -> None:
    docs = documents()
    engine = engine_factory(enable_hierarchical_cache=True, hicache_write_policy="write_back")
    engine.generate(input_ids=[*docs[0], 10, 11], sampling_params=GREEDY)
    assert engine.get_server_info()["hicache_backed_up_blocks"] == 0
    engine.generate(input_ids=[*docs[1], 10, 11], sampling_params=GREEDY)  # evicts doc 0
    assert engine.get_server_info()["hicache_backed_up_blocks"] >= 9


def test_restarted_engine_answers_from_the_disk_tier(
    engine_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FILE_STORAGE_DIR_ENV, str(tmp_path))
    docs = documents(count=1, length=200)
    ask = [*docs[0], 10, 11]
    plain = engine_factory().generate(input_ids=ask, sampling_params=GREEDY)
    first = engine_factory(enable_hierarchical_cache=True, hicache_storage_backend="file")
    assert (
        first.generate(input_ids=ask, sampling_params=GREEDY)["output_ids"] == plain["output_ids"]
    )
    assert len(list(tmp_path.glob("*.kvblock"))) == 6  # 200 tokens: 6 full blocks
    first.shutdown()
    second = engine_factory(enable_hierarchical_cache=True, hicache_storage_backend="file")
    again = second.generate(input_ids=ask, sampling_params=GREEDY)
    assert again["output_ids"] == plain["output_ids"]
    assert again["meta_info"]["cached_tokens"] == 192
    assert again["meta_info"]["cached_tokens_details"] == {"device": 0, "host": 0, "storage": 192}
    info = second.get_server_info()
    assert info["cached_tokens_storage_total"] == 192 and info["hicache_storage_dir"] == str(
        tmp_path
    )
    # A corrupt block is ignored: the prompt recomputes from there, outputs unchanged.
    assert second.flush_cache()
    blocks = sorted(tmp_path.glob("*.kvblock"), key=lambda p: p.stat().st_mtime_ns)
    for path in blocks:
        path.write_bytes(path.read_bytes()[:-7])
    third = engine_factory(enable_hierarchical_cache=True, hicache_storage_backend="file")
    out = third.generate(input_ids=ask, sampling_params=GREEDY)
    assert out["output_ids"] == plain["output_ids"]
    assert out["meta_info"]["cached_tokens"] == 0
    assert third.get_server_info()["hicache_storage_corrupt_files"] == 1
    assert_no_leak(third)


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"hicache_storage_backend": "file"}, "--hicache-storage-backend"),
        ({"hicache_ratio": 3.0}, "--hicache-ratio"),
        (
            {"enable_hierarchical_cache": True, "hicache_storage_backend": "mooncake"},
            "--hicache-storage-backend",
        ),
        ({"enable_hierarchical_cache": True, "disable_radix_cache": True}, "--enable-hier"),
        ({"enable_hierarchical_cache": True, "hicache_ratio": 0.0}, "--hicache-ratio"),
        ({"enable_hierarchical_cache": True, "hicache_mem_layout": "layer_first"}, "--hicache-mem"),
        ({"enable_hierarchical_cache": True, "enable_lora": True}, "--enable-hier"),
    ],
)
def test_bad_hicache_options_are_refused(engine_factory: Any, kwargs: Any, option: str) -> None:
    with pytest.raises(ServerArgsError, match=option):
        engine_factory(**kwargs)


def test_http_server_info_and_metrics_report_hits_per_tier(engine_factory: Any) -> None:
    from fastapi.testclient import TestClient

    from radixserve.entrypoints.http_server import create_app

    engine = engine_factory(enable_hierarchical_cache=True, enable_metrics=True)
    docs = documents()
    with TestClient(create_app(engine, engine.server_args)) as client:
        metas = []
        for rnd in range(2):
            for doc in docs:
                body = {"input_ids": [*doc, 10 + rnd], "sampling_params": GREEDY}
                r = client.post("/generate", json=body)
                assert r.status_code == 200, r.text
                metas.append(r.json()["meta_info"])
        assert metas[-1]["cached_tokens_details"] == {"device": 0, "host": 288, "storage": 0}
        info = client.get("/get_server_info").json()
        assert info["cached_tokens_host_total"] == 3 * 288
        assert info["cached_tokens_device_total"] == 0
        assert info["hicache_write_policy"] == "write_through"
        text = client.get("/metrics").text
        assert "sglang:hicache_cached_tokens_total{model_name=" in text
        line = next(x for x in text.splitlines() if 'tier="host"' in x)
        assert float(line.rsplit(" ", 1)[1]) == 3 * 288


@pytest.mark.parametrize(
    "kwargs",
    [{"page_size": 4, "chunked_prefill_size": 64}, {"max_total_tokens": 400}],
)
def test_batched_loads_keep_outputs_and_conserve_kv(engine_factory: Any, kwargs: Any) -> None:
    """Several requests admitted in one step, each loading its document back from the host
    (page size 4 with chunked prefill; a pool that fits two documents at a time)."""
    docs = documents(count=4, length=150)
    asks = [[*doc, 10 + q, 30] for q in range(2) for doc in docs]
    plain = engine_factory(**kwargs)
    want = [r["output_ids"] for r in plain.generate(input_ids=asks, sampling_params=GREEDY)]
    tiered = engine_factory(enable_hierarchical_cache=True, **kwargs)
    for doc in docs:  # warm the host tier; the device keeps only the last documents
        tiered.generate(input_ids=[*doc, 99], sampling_params=GREEDY)
    got = tiered.generate(input_ids=asks, sampling_params=GREEDY)
    assert [r["output_ids"] for r in got] == want
    assert tiered.get_server_info()["cached_tokens_host_total"] > 0
    assert_no_leak(tiered)


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_speculative_decoding_over_the_tiers(engine_factory: Any, policy: str) -> None:
    """NGRAM speculation with the host tier: only verified tokens reach the radix cache (and so
    the host copies), outputs equal the plain engine's, prefixes come back from the host, and
    no slot leaks on either tier."""
    docs = [[*doc[:200], *doc[:40] * 2] for doc in documents()]  # repetitive: drafts land
    params = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}

    def ask(engine: Engine) -> list[dict[str, Any]]:
        return [
            engine.generate(input_ids=[*doc, 10 + rnd, 20 + i], sampling_params=params)
            for rnd in range(2)
            for i, doc in enumerate(docs)
        ]

    want = [r["output_ids"] for r in ask(engine_factory())]
    spec = engine_factory(
        enable_hierarchical_cache=True,
        hicache_write_policy=policy,
        speculative_algorithm="NGRAM",
    )
    got = ask(spec)
    assert [r["output_ids"] for r in got] == want
    assert sum(r["meta_info"]["spec_accept_token_num"] for r in got) > 0
    assert all(r["meta_info"]["cached_tokens_details"]["host"] > 0 for r in got[3:])
    assert_no_leak(spec)


@pytest.mark.parametrize(
    "tiers", [{}, {"enable_hierarchical_cache": True}], ids=["device", "hicache"]
)
def test_one_rule_for_requests_larger_than_the_device_pool(
    engine_factory: Any, tiers: dict
) -> None:
    """Issue 31: a request is refused (400) when its prompt plus max_new_tokens exceeds the
    device KV pool, with the host tier or without it: the running sequence's KV lives on the
    device whatever the tiers hold. One token under the pool is served."""
    engine = engine_factory(**tiers)
    pool = engine.get_server_info()["max_total_num_tokens"]
    assert pool == DEVICE_TOKENS
    rng = random.Random(1)
    new = GREEDY["max_new_tokens"]
    for prompt_len in (pool - new + 1, pool + 68, 2 * pool - 20):
        ids = [rng.randrange(3, TINY_VOCAB) for _ in range(prompt_len)]
        reason = engine.generate(input_ids=ids, sampling_params=GREEDY)["meta_info"][
            "finish_reason"
        ]
        assert reason["type"] == "abort" and reason["status_code"] == 400, prompt_len
        assert f"needs {prompt_len + new} KV tokens" in reason["message"]
        assert f"holds {pool}" in reason["message"]
    fits = [rng.randrange(3, TINY_VOCAB) for _ in range(pool - new)]
    out = engine.generate(input_ids=fits, sampling_params=GREEDY)
    assert out["meta_info"]["finish_reason"]["type"] == "length"
    assert engine.flush_cache()  # the refused requests held nothing
    info = engine.get_server_info()
    assert info["available_kv_tokens"] == info["max_total_num_tokens"]
