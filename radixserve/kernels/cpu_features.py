"""What the CPU can do, read at run time (never assumed from the build machine)."""

from __future__ import annotations

import functools
import hashlib
import platform
from dataclasses import dataclass
from pathlib import Path

# Flags that change which kernels are fastest or even legal on this machine.
INTERESTING_FLAGS = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)


@dataclass(frozen=True)
class CpuFeatures:
    model_name: str
    flags: frozenset[str]

    @property
    def bf16_flags(self) -> tuple[str, ...]:
        """The flags of native bfloat16 units this CPU reports (AVX512-BF16, AMX-BF16)."""
        return tuple(f for f in ("avx512_bf16", "amx_bf16") if f in self.flags)

    @property
    def summary(self) -> str:
        present = [f for f in INTERESTING_FLAGS if f in self.flags]
        return f"{self.model_name} [{' '.join(present) or 'no SIMD extensions of note'}]"

    @property
    def fingerprint(self) -> str:
        """Short hash of the model and flags: a build for one CPU is never reused on another."""
        key = f"{platform.machine()}|{self.model_name}|{' '.join(sorted(self.flags))}"
        return hashlib.sha256(key.encode()).hexdigest()[:12]


@functools.cache
def cpu_features() -> CpuFeatures:
    model, flags = platform.processor() or platform.machine(), frozenset()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name":
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = frozenset(value.split())
    return CpuFeatures(model, flags)
