"""KV pool sizing: SGLang's memory fraction, capped on CPU when nothing was asked for."""

from __future__ import annotations

import pytest

from radixserve.model_executor.memory_plan import CPU_KV_CAP_MIN, plan_kv_pool
from radixserve.server_args import ServerArgs

GIB = 2**30
BASE = {
    "device": "cpu",
    "memory_bytes": 24 * GIB,
    "mem_fraction_static": 0.5,
    "weight_bytes": 500 * 2**20,
    "bytes_per_token": 46_080,
    "context_len": 8192,
    "page_size": 1,
    "max_total_tokens": None,
    "sized_by_default": True,
}


def test_cpu_default_is_capped_with_the_reason() -> None:
    pool = plan_kv_pool(**BASE)
    assert pool.tokens == max(4 * 8192, CPU_KV_CAP_MIN) == 65_536
    assert "capped on CPU" in pool.reason and "--max-total-tokens" in pool.reason


def test_long_context_models_get_four_contexts() -> None:
    pool = plan_kv_pool(**{**BASE, "context_len": 32_768, "bytes_per_token": 4096})
    assert pool.tokens == 4 * 32_768


def test_an_explicit_fraction_or_size_is_honoured() -> None:
    from_memory = (int(24 * GIB * 0.5) - 500 * 2**20) // 46_080
    explicit = plan_kv_pool(**{**BASE, "sized_by_default": False})
    assert explicit.tokens == from_memory and "--mem-fraction-static 0.5" in explicit.reason
    sized = plan_kv_pool(**{**BASE, "max_total_tokens": 1000, "sized_by_default": False})
    assert sized == (1000, "--max-total-tokens")


def test_gpus_keep_sglang_sizing_and_pages_round_down() -> None:
    cuda = plan_kv_pool(**{**BASE, "device": "cuda", "page_size": 16})
    assert cuda.tokens > CPU_KV_CAP_MIN and cuda.tokens % 16 == 0


def test_too_small_a_pool_is_refused() -> None:
    with pytest.raises(ValueError, match="raise --mem-fraction-static"):
        plan_kv_pool(
            **{**BASE, "memory_bytes": GIB, "weight_bytes": GIB, "sized_by_default": False}
        )


def test_server_args_record_whether_the_pool_was_sized_by_default() -> None:
    assert ServerArgs(device="cpu").kv_pool_sized_by_default
    assert not ServerArgs(device="cpu", mem_fraction_static=0.3).kv_pool_sized_by_default
    assert not ServerArgs(device="cpu", max_total_tokens=4096).kv_pool_sized_by_default


def test_a_cpu_model_larger_than_the_default_fraction_still_gets_a_pool() -> None:
    """17 GiB of weights on a 24 GiB host: half the RAM leaves nothing, 90% leaves a pool; an
    explicit fraction is still honoured (and refused when it leaves nothing)."""
    big = {**BASE, "weight_bytes": 17 * GIB, "bytes_per_token": 98_304, "context_len": 4096}
    pool = plan_kv_pool(**big)
    assert pool.tokens == (int(24 * GIB * 0.9) - 17 * GIB) // 98_304
    assert "exceed the default --mem-fraction-static" in pool.reason
    with pytest.raises(ValueError, match="raise --mem-fraction-static"):
        plan_kv_pool(**{**big, "sized_by_default": False})
    small = plan_kv_pool(**BASE)  # a small model keeps the capped default
    assert "capped on CPU" in small.reason
