"""The hierarchical cache's tiers on their own: byte-exact round trips device -> host -> device
and host -> disk -> host, LRU eviction from a full host pool, and bad disk files ignored."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from radixserve.mem_cache.hicache.block_hash import block_hashes, identity_seed
from radixserve.mem_cache.hicache.config import HiCacheConfig
from radixserve.mem_cache.hicache.controller import HiCacheController
from radixserve.mem_cache.hicache.file_storage import FileStorage
from radixserve.mem_cache.hicache.host_pool import HostKVPool
from radixserve.mem_cache.kv_cache import KVCache

BLOCK = 4


def make_kv(dtype: torch.dtype = torch.float32, size: int = 64) -> KVCache:
    kv = KVCache(size, num_layers=3, num_kv_heads=2, head_dim=8, dtype=dtype, device="cpu")
    gen = torch.Generator().manual_seed(0)
    for buf in (*kv.k_buffers, *kv.v_buffers):
        buf[:size].copy_(torch.randn(buf[:size].shape, generator=gen).to(dtype))
    return kv


def make_controller(
    kv: KVCache, storage: Path | None = None, blocks: int = 8, identity: str = "m"
) -> HiCacheController:
    config = HiCacheConfig(
        write_policy="write_through",
        host_ratio=blocks * BLOCK / kv.size,
        host_size_gb=0,
        block_tokens=BLOCK,
        storage_dir=None if storage is None else str(storage),
    )
    return HiCacheController(config, kv, identity)


def raw(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def kv_rows(kv: KVCache, slots: torch.Tensor) -> bytes:
    return b"".join(
        raw(k[slots]) + raw(v[slots]) for k, v in zip(kv.k_buffers, kv.v_buffers, strict=True)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_device_host_device_round_trip_is_byte_exact(dtype: torch.dtype) -> None:
    kv = make_kv(dtype)
    hc = make_controller(kv)
    tokens = list(range(100, 114))  # 3 full blocks + 2 tokens that never leave the device
    src = torch.arange(20, 34)
    assert hc.backup(tokens, src) == 3
    assert hc.backup(tokens, src) == 0  # already there
    # A request whose first 2 tokens are still on the device loads the rest of 3 blocks.
    plan = hc.find(tokens, 2, len(tokens))
    assert (plan.offset, plan.host_tokens, plan.storage_tokens) == (2, 10, 0)
    dst = torch.arange(40, 50)
    hc.load(plan, dst)
    assert kv_rows(kv, dst) == kv_rows(kv, src[2:12])
    assert hc.stats.host_hit_tokens == 10
    # A different prefix shares no block: the hashes chain over every earlier token.
    assert hc.find([7, *tokens[1:]], 0, len(tokens)).tokens == 0


def test_host_disk_host_round_trip_is_byte_exact(tmp_path: Path) -> None:
    kv = make_kv()
    hc = make_controller(kv, storage=tmp_path)
    tokens = list(range(8))
    src = torch.arange(8)
    hc.backup(tokens, src)
    assert len(list(tmp_path.glob("*.kvblock"))) == 2
    hc.clear_host()
    # A new controller (a restarted server) on the same folder reads the blocks back.
    fresh = make_controller(kv, storage=tmp_path)
    plan = fresh.find(tokens, 0, 8)
    assert (plan.host_tokens, plan.storage_tokens) == (0, 8)
    dst = torch.arange(30, 38)
    fresh.load(plan, dst)
    assert kv_rows(kv, dst) == kv_rows(kv, src)
    # The blocks are in host memory now: the next find hits the host tier.
    assert fresh.find(tokens, 0, 8).host_tokens == 8


def test_another_model_does_not_read_the_blocks(tmp_path: Path) -> None:
    kv = make_kv()
    make_controller(kv, storage=tmp_path, identity="model-a").backup(
        list(range(8)), torch.arange(8)
    )
    other = make_controller(kv, storage=tmp_path, identity="model-b")
    assert other.find(list(range(8)), 0, 8).tokens == 0


def _stored_block(tmp_path: Path) -> tuple[FileStorage, str, list[int], torch.Tensor]:
    shape = (3, 2, BLOCK, 2, 8)
    store = FileStorage(tmp_path, "model-a", shape, torch.float32)
    tokens = [5, 6, 7, 8]
    key = block_hashes(identity_seed("model-a"), tokens, BLOCK, 1)[0]
    block = torch.randn(shape)
    assert store.write(key, tokens, block)
    return store, key, tokens, block


@pytest.mark.parametrize("damage", ["truncate", "flip_payload", "flip_header", "empty"])
def test_corrupt_or_truncated_file_is_logged_and_ignored(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    store, key, tokens, block = _stored_block(tmp_path)
    path = store.path(key)
    data = bytearray(path.read_bytes())
    assert raw(store.read(key, tokens)) == raw(block)  # type: ignore[arg-type]
    if damage == "truncate":
        data = data[: len(data) - 100]
    elif damage == "flip_payload":
        data[-5] ^= 0xFF
    elif damage == "flip_header":
        data[20] ^= 0x55
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        assert store.read(key, tokens) is None
    assert "ignoring" in caplog.text and store.corrupt_files == 1
    assert not path.exists()  # deleted, so the next write-through stores a good copy


def test_file_for_other_tokens_is_not_served(tmp_path: Path) -> None:
    store, key, _, _ = _stored_block(tmp_path)
    assert store.read(key, [5, 6, 7, 9]) is None
    assert store.corrupt_files == 1


def test_host_pool_evicts_least_recently_used_unpinned_block() -> None:
    pool = HostKVPool(2, BLOCK, 1, 1, 2, torch.float32)
    a, b = pool.allocate("a"), pool.allocate("b")
    assert a is not None and b is not None
    pool.lookup("a")  # "b" is now the least recently used
    c = pool.allocate("c")
    assert c == b and not pool.contains("b") and pool.contains("a")
    pool.pin(a)
    d = pool.allocate("d")  # "a" is older but pinned: "c" goes
    assert d == c and pool.contains("a") and not pool.contains("c")
    pool.pin(d)
    assert pool.allocate("e") is None  # everything pinned: refuse, evict nothing
    assert pool.used_blocks() == 2


def test_backup_into_a_full_host_pool_keeps_the_newest_blocks() -> None:
    kv = make_kv()
    hc = make_controller(kv, blocks=2)
    tokens = list(range(16))
    assert hc.backup(tokens, torch.arange(16)) == 2  # room for 2 of 4 blocks
    plan = hc.find(tokens, 0, 16)
    assert plan.tokens == 8
    hc.release(plan)  # unpinned: evictable again
    other = list(range(50, 58))
    hc.backup(other, torch.arange(16, 24))  # evicts the old blocks
    assert hc.find(tokens, 0, 16).tokens == 0
    plan = hc.find(other, 0, 8)
    assert plan.tokens == 8
    hc.release(plan)


def test_a_host_tier_larger_than_free_memory_is_refused() -> None:
    from radixserve.mem_cache.hicache.host_memory import check_host_tier_fits, mem_available_bytes

    available = mem_available_bytes()
    if available is None:
        pytest.skip("no /proc/meminfo")
    check_host_tier_fits(1 << 20, 1 << 20, device_is_cpu=True)
    with pytest.raises(ValueError, match="--hicache-ratio"):
        check_host_tier_fits(2 * available, 0, device_is_cpu=False)
    with pytest.raises(ValueError, match="after the device KV pool"):
        check_host_tier_fits(available, available, device_is_cpu=True)
