"""What the machine can do, detected and measured in the same run as the benchmark.

`detect_hardware()` reads the CPU's features (/proc/cpuinfo flags and torch's own dispatch
level), the thread count torch uses, and measures two ceilings: memory bandwidth (best of a few
large tensor copies) and matmul throughput (fp32, and bf16 where the CPU has native bf16 — else
bf16 is reported as emulated and not measured). `ceiling_shares()` turns an achieved rate into
shares of those ceilings. Measuring takes well under 3 s with the default sizes.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

# The features that decide which kernels a CPU can run fast, in the order they are reported.
CPU_FEATURES = (
    "avx2",
    "avx512f",
    "avx512_bf16",
    "amx_bf16",
    "amx_tile",
    "avx512_vnni",
    "avx_vnni",
)
_BF16_NATIVE_FEATURES = frozenset({"avx512_bf16", "amx_bf16"})
CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class HardwareInfo:
    """The machine and its measured ceilings (GB/s and GFLOP/s on `device`)."""

    device: str
    cpu_model: str
    logical_cpus: int
    threads: int  # torch.get_num_threads(): the cores the benchmark actually uses
    features: tuple[str, ...]  # the CPU_FEATURES present
    cpu_capability: str  # torch.backends.cpu.get_cpu_capability(), e.g. "AVX2", "AVX512"
    memory_bandwidth_gbs: float
    fp32_gflops: float
    bf16_gflops: float | None  # None: not native here (emulated), so not measured
    bf16_native: bool

    def has(self, feature: str) -> bool:
        return feature in self.features

    def compute_ceiling_gflops(self, dtype: str | torch.dtype) -> float:
        """The matmul ceiling for weights of `dtype`; fp32's where bf16 is not native (the
        emulated bf16 path is slower still, so fp32's is a generous bound)."""
        name = str(dtype).removeprefix("torch.")
        if name in ("bfloat16", "float16") and self.bf16_gflops is not None:
            return self.bf16_gflops
        return self.fp32_gflops

    def describe(self) -> list[str]:
        """Human-readable lines for the tools' headers."""
        features = ", ".join(f if self.has(f) else f"no {f}" for f in CPU_FEATURES)
        bf16 = (
            f"{self.bf16_gflops:.1f} GFLOP/s (native)"
            if self.bf16_gflops is not None
            else "emulated (no avx512_bf16/AMX), not measured"
        )
        return [
            f"CPU: {self.cpu_model} ({self.logical_cpus} logical CPUs, torch uses "
            f"{self.threads} threads, dispatch {self.cpu_capability})",
            f"CPU features: {features}",
            f"Measured on {self.device}: memory bandwidth {self.memory_bandwidth_gbs:.1f} GB/s, "
            f"fp32 matmul {self.fp32_gflops:.1f} GFLOP/s, bf16 matmul {bf16}",
        ]


@dataclass(frozen=True)
class CeilingShares:
    achieved_gflops: float
    achieved_gbs: float
    compute_share: float  # of the matmul ceiling, 0..1 (can exceed 1 if the model is wrong)
    bandwidth_share: float  # of the memory-bandwidth ceiling

    def describe(self, label: str) -> str:
        return (
            f"{label}: {self.achieved_gflops:.1f} GFLOP/s = {100 * self.compute_share:.1f}% of "
            f"compute, {self.achieved_gbs:.1f} GB/s = {100 * self.bandwidth_share:.1f}% of "
            "memory bandwidth"
        )


def ceiling_shares(
    tokens_per_s: float,
    bytes_per_token: float,
    flops_per_token: float,
    hardware: HardwareInfo,
    dtype: str | torch.dtype = "float32",
) -> CeilingShares:
    """Shares of the measured ceilings that `tokens_per_s` reaches, given what each token costs
    in bytes moved and floating-point operations."""
    gflops = tokens_per_s * flops_per_token / 1e9
    gbs = tokens_per_s * bytes_per_token / 1e9
    compute_ceiling = hardware.compute_ceiling_gflops(dtype)
    bandwidth = hardware.memory_bandwidth_gbs
    return CeilingShares(
        achieved_gflops=gflops,
        achieved_gbs=gbs,
        compute_share=gflops / compute_ceiling if compute_ceiling > 0 else 0.0,
        bandwidth_share=gbs / bandwidth if bandwidth > 0 else 0.0,
    )


def read_cpu_flags(path: Path = CPUINFO) -> frozenset[str]:
    """The first processor's flags (x86 "flags", ARM "Features"); empty when unreadable."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpu_model_name(path: Path = CPUINFO) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Hardware", "cpu model") and value.strip():
            return value.strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best_time(
    fn: Callable[[], object], repeats: int, budget_s: float, device: torch.device
) -> float:
    """Fastest of up to `repeats` calls of fn (after one untimed call), within budget_s."""
    fn()
    _sync(device)
    best = float("inf")
    deadline = time.perf_counter() + budget_s
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
        if time.perf_counter() > deadline:
            break
    return best


def measure_bandwidth_gbs(
    device: str | torch.device = "cpu",
    num_bytes: int = 1 << 27,
    repeats: int = 5,
    budget_s: float = 0.8,
) -> float:
    """Copy bandwidth (bytes read + bytes written per second, GB/s) of a tensor far larger than
    the caches: the ceiling for streaming weights and KV."""
    dev = torch.device(device)
    src = torch.ones(num_bytes // 4, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    seconds = _best_time(lambda: dst.copy_(src), repeats, budget_s, dev)
    return 2 * src.numel() * 4 / seconds / 1e9


def measure_matmul_gflops(
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    size: int = 1024,
    repeats: int = 5,
    budget_s: float = 0.6,
) -> float:
    """GFLOP/s of a square matmul of `size` (2 * size**3 flops each)."""
    dev = torch.device(device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(device=dev, dtype=dtype)
    b = torch.randn(size, size, generator=gen).to(device=dev, dtype=dtype)
    out = torch.empty(size, size, device=dev, dtype=dtype)
    with torch.inference_mode():
        seconds = _best_time(lambda: torch.matmul(a, b, out=out), repeats, budget_s, dev)
    return 2 * size**3 / seconds / 1e9


def detect_hardware(
    device: str | torch.device = "cpu",
    *,
    bandwidth_bytes: int = 1 << 27,
    matmul_size: int = 1024,
) -> HardwareInfo:
    """Detect the CPU and measure the ceilings on `device` (cpu or cuda)."""
    dev = torch.device(device)
    flags = read_cpu_flags()
    start = time.perf_counter()
    bandwidth = measure_bandwidth_gbs(dev, bandwidth_bytes)
    fp32 = measure_matmul_gflops(torch.float32, dev, matmul_size)
    bf16_native = dev.type == "cuda" or bool(flags & _BF16_NATIVE_FEATURES)
    bf16 = measure_matmul_gflops(torch.bfloat16, dev, matmul_size) if bf16_native else None
    logger.debug("Hardware ceilings measured in %.2f s", time.perf_counter() - start)
    return HardwareInfo(
        device=str(dev),
        cpu_model=cpu_model_name(),
        logical_cpus=os.cpu_count() or 1,
        threads=torch.get_num_threads(),
        features=tuple(f for f in CPU_FEATURES if f in flags),
        cpu_capability=str(torch.backends.cpu.get_cpu_capability()),
        memory_bandwidth_gbs=bandwidth,
        fp32_gflops=fp32,
        bf16_gflops=bf16,
        bf16_native=bf16_native,
    )
