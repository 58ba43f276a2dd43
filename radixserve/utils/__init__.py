"""Small host and environment helpers shared across the package."""

from __future__ import annotations

import functools
import logging
import os

logger = logging.getLogger(__name__)

_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags from /proc/cpuinfo (empty where it does not exist)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_has_native_bf16() -> bool:
    """True when the CPU computes bfloat16 natively (AVX512-BF16 or AMX-BF16)."""
    return any(flag in cpu_flags() for flag in _BF16_CPU_FLAGS)


def env_flag(name: str, default: bool = False) -> bool:
    """A boolean environment variable: 1/true/yes/on are true, 0/false/no/off/"" false."""
    value = os.environ.get(name)
    if value is None:
        return default
    value = value.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"environment variable {name}={value!r} is not a boolean (use 1 or 0)")
