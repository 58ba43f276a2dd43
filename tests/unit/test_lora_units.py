"""LoRA pieces without a model: --lora-paths forms and limits, the slot eviction policies, and
the prefix-cache namespaces that keep adapters' KV apart."""

from __future__ import annotations

import pytest
import torch

from radixserve.lora.config import (
    SUPPORTED_TARGET_MODULES,
    AdapterSpec,
    lora_config_from_options,
    parse_lora_paths,
)
from radixserve.lora.slots import AdapterSlots
from radixserve.mem_cache.namespace import namespaced_key
from radixserve.mem_cache.radix_cache import RadixCache


def test_lora_paths_accepts_sglang_forms() -> None:
    specs = parse_lora_paths(
        ["/a/one", "two=/b/two", '{"lora_name": "three", "lora_path": "/c", "pinned": true}']
    )
    assert specs == (
        AdapterSpec("/a/one", "/a/one"),
        AdapterSpec("two", "/b/two"),
        AdapterSpec("three", "/c", pinned=True),
    )
    assert parse_lora_paths({"x": "/p"}) == (AdapterSpec("x", "/p"),)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (["a=/x", "a=/y"], "given twice"),
        (["a:b=/x"], "Invalid LoRA adapter name"),
        (['{"lora_name": "a"}'], "needs"),
        (['{"lora_name": "a", "lora_path": "/x", "pinned": "yes"}'], "pinned"),
        (["{not json"], "invalid JSON"),
        (["a="], "empty path"),
    ],
)
def test_bad_lora_paths_are_refused(value: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_lora_paths(value)


def test_lora_config_defaults_and_limits() -> None:
    assert lora_config_from_options({}) is None
    cfg = lora_config_from_options({"lora_paths": ["a=/x"]})  # implies --enable-lora
    assert cfg is not None and cfg.max_loras_per_batch == 8 and cfg.eviction_policy == "lru"
    assert cfg.target_modules == SUPPORTED_TARGET_MODULES and cfg.max_lora_rank is None
    cfg = lora_config_from_options({"enable_lora": True, "lora_target_modules": ["gate_up_proj"]})
    assert cfg is not None and cfg.target_modules == ("gate_proj", "up_proj")
    with pytest.raises(ValueError, match="--max-loaded-loras"):
        lora_config_from_options(
            {"enable_lora": True, "max_loras_per_batch": 4, "max_loaded_loras": 2}
        )
    with pytest.raises(ValueError, match="not supported on this model family"):
        lora_config_from_options({"enable_lora": True, "lora_target_modules": ["lm_head"]})


@pytest.mark.parametrize(("policy", "evicted"), [("lru", 2), ("fifo", 1)])
def test_slot_eviction_policies(policy: str, evicted: int) -> None:
    slots = AdapterSlots(2, policy)
    slots.place(1, {1})
    slots.place(2, {2})
    slots.place(1, {1})  # adapter 1 used again: lru keeps it, fifo still evicts it first
    placement = slots.place(3, {3})
    assert placement.fresh and placement.evicted == evicted
    assert sorted(slots.resident()) == sorted({1, 2, 3} - {evicted})


def test_slots_never_evict_the_batch_or_pinned_adapters() -> None:
    slots = AdapterSlots(2, "lru")
    slots.pin(7)
    with pytest.raises(ValueError, match="one must stay free"):
        slots.pin(8)
    slots.place(1, {1})
    assert slots.place(2, {2}).evicted == 1  # 7 is pinned
    with pytest.raises(RuntimeError, match="max-loras-per-batch"):
        slots.place(3, {2, 3})
    assert slots.release(7) is not None and slots.place(3, {2, 3}).evicted is None


def test_namespaces_never_share_cached_prefixes() -> None:
    cache = RadixCache()
    tokens = [5, 6, 7, 8]
    cache.insert(namespaced_key(tokens, 0), torch.arange(4))
    cache.insert(namespaced_key(tokens, 3), torch.arange(10, 14))
    assert cache.match_prefix(namespaced_key(tokens, 0)).indices.tolist() == [0, 1, 2, 3]
    assert cache.match_prefix(namespaced_key(tokens, 3)).indices.tolist() == [10, 11, 12, 13]
    assert len(cache.match_prefix(namespaced_key(tokens, 4)).indices) == 0
    assert namespaced_key(tokens, 0) is tokens  # the base model's keys are untouched
    cache.check_integrity()
