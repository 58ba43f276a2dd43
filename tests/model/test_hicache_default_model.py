"""The hierarchical cache on the real default model (float32): prompts whose KV comes back from
the host tier or, after a restart, from disk give the same greedy tokens as a plain engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixserve import Engine
from radixserve.mem_cache.hicache.config import FILE_STORAGE_DIR_ENV

TOPICS = ["the ocean", "a forest at night", "how bicycles work"]
PARAMS = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}


def prompts(engine: Engine) -> list[list[int]]:
    out = []
    for topic in TOPICS:
        doc = " ".join(f"Sentence {i} of a long note about {topic}." for i in range(40))
        ids = engine.tokenizer.encode(doc, add_special_tokens=False)
        out.append(ids + engine.tokenizer.encode(" Summary:", add_special_tokens=False))
    return out


def twice(engine: Engine, asks: list[list[int]]) -> list[dict]:
    return [engine.generate(input_ids=p, sampling_params=PARAMS) for _ in range(2) for p in asks]


@pytest.mark.slow
def test_tiers_keep_greedy_outputs_on_the_default_model(
    default_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FILE_STORAGE_DIR_ENV, str(tmp_path))
    base = {
        "model_path": str(default_gguf),
        "dtype": "float32",
        "quantization": "unquant",
        "runtime": "thread",
    }
    with Engine(max_total_tokens=4096, disable_radix_cache=True, **base) as plain:
        asks = prompts(plain)
        want = [r["output_ids"] for r in twice(plain, asks)]
    longest = max(len(p) for p in asks)
    tiered = {
        "max_total_tokens": longest + 64,  # one prompt fits on the device at a time
        "enable_hierarchical_cache": True,
        "hicache_ratio": 4.0,  # the host tier holds all three prompts
        "hicache_storage_backend": "file",
        **base,
    }
    with Engine(**tiered) as engine:
        engine.scheduler.check_kv_each_step = True
        got = twice(engine, asks)
        info = engine.get_server_info()
        assert engine.flush_cache()
        assert engine.get_server_info()["available_kv_tokens"] == info["max_total_num_tokens"]
    assert [r["output_ids"] for r in got] == want
    assert info["cached_tokens_host_total"] >= 3 * 32 * (min(map(len, asks)) // 32 - 1)
    with Engine(**tiered) as restarted:
        again = twice(restarted, asks)
    assert [r["output_ids"] for r in again] == want
    assert again[0]["meta_info"]["cached_tokens_details"]["storage"] > 0
