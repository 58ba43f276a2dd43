"""Device-fitting defaults: SGLang's tables on CUDA, RAM-based choices on CPU, hardware probes."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixserve.options import hardware
from radixserve.options.resolve import (
    CPU_CHUNKED_PREFILL_SIZE,
    default_chunked_prefill_size,
    default_cuda_graph_max_bs,
    default_mem_fraction_static,
    resolve_dtype,
    resolve_kv_cache_dtype,
)
from radixserve.utils.auto_dtype import DtypeChoice

GIB = 1 << 30


@pytest.mark.parametrize(
    ("memory_gib", "chunk", "graph_bs"),
    [
        (16, 2048, 8),
        (24, 2048, 24),
        (40, 4096, 32),
        (80, 8192, 256),
        (141, 8192, 256),
        (192, 16384, 512),
    ],
)
def test_cuda_table(memory_gib: int, chunk: int, graph_bs: int) -> None:
    assert default_chunked_prefill_size("cuda", memory_gib * GIB) == chunk
    assert default_cuda_graph_max_bs("cuda", memory_gib * GIB, 32) == graph_bs


def test_unknown_memory_uses_sglang_fallbacks() -> None:
    assert default_chunked_prefill_size("cuda", None) == 4096
    assert default_cuda_graph_max_bs("cuda", None, 32) == 160
    assert default_mem_fraction_static("cuda", None, 4096, 1, 1) == 0.88


def test_cuda_mem_fraction_formula() -> None:
    # 16 GiB, chunk 2048: reserved = 512 + 2048 * 1.5 + 128 = 3712 MiB.
    assert default_mem_fraction_static("cuda", 16 * GIB, 2048, 1, 1) == round(
        (16384 - 3712) / 16384, 3
    )
    # Above 60 GiB at least 10 GiB stay reserved.
    assert default_mem_fraction_static("cuda", 141 * GIB, 2048, 1, 1) == round(
        (141 * 1024 - 10240) / (141 * 1024), 3
    )


def test_cpu_defaults_fit_ram() -> None:
    assert default_chunked_prefill_size("cpu", 24 * GIB) == CPU_CHUNKED_PREFILL_SIZE
    assert default_mem_fraction_static("cpu", 24 * GIB, 512, 1, 1) == 0.5
    # Large hosts keep weights + KV pool at 16 GiB unless told otherwise.
    assert default_mem_fraction_static("cpu", 64 * GIB, 512, 1, 1) == 0.25
    assert default_cuda_graph_max_bs("cpu", 24 * GIB, 16) == 16


def test_dtype_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "cpu_auto_dtype", lambda: DtypeChoice("float32", "none"))
    assert resolve_dtype("auto", "cpu") == "float32"
    monkeypatch.setattr(hardware, "cpu_auto_dtype", lambda: DtypeChoice("bfloat16", "probed"))
    assert resolve_dtype("auto", "cpu") == "bfloat16"
    monkeypatch.setattr(hardware, "cuda_supports_bf16", lambda: False)
    assert resolve_dtype("auto", "cuda") == "float16"
    assert resolve_dtype("half", "cpu") == "float16"
    assert resolve_dtype("float", "cuda") == "float32"
    assert resolve_kv_cache_dtype("auto", "float16") == "float16"
    assert resolve_kv_cache_dtype("bf16", "float32") == "bfloat16"


def test_cpu_memory_respects_cgroup_limit(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       25165824 kB\nMemFree: 1 kB\n", encoding="utf-8")
    limit = tmp_path / "memory.max"
    limit.write_text(f"{8 * GIB}\n", encoding="utf-8")
    unlimited = tmp_path / "unlimited"
    unlimited.write_text("max\n", encoding="utf-8")
    assert hardware.cpu_memory_bytes(str(meminfo), (str(unlimited),)) == 24 * GIB
    assert hardware.cpu_memory_bytes(str(meminfo), (str(limit),)) == 8 * GIB
    assert hardware.cpu_memory_bytes(str(tmp_path / "none"), ()) is None
