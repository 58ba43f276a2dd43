"""Refuse a host tier that cannot fit in memory, before it is filled and the server is killed.

The pools are allocated with torch.empty, so memory is committed only as blocks are written:
an oversized tier would start fine and die later. On a CPU server the device KV pool lives in
the same RAM and is committed lazily too, so it counts against what is left.
"""

from __future__ import annotations

from pathlib import Path


def mem_available_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    try:
        lines = Path(meminfo).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def check_host_tier_fits(host_bytes: int, device_pool_bytes: int, device_is_cpu: bool) -> None:
    """Raise ValueError (naming the options to change) if the host tier would not fit."""
    available = mem_available_bytes()
    if available is None:
        return
    left = available - (device_pool_bytes if device_is_cpu else 0)
    if host_bytes > left:
        raise ValueError(
            f"--enable-hierarchical-cache: the host KV tier needs {host_bytes / 2**30:.2f} GiB "
            f"but only {max(left, 0) / 2**30:.2f} GiB of memory is available"
            + (" after the device KV pool" if device_is_cpu else "")
            + "; lower --hicache-ratio, set --hicache-size (GB), or shrink the device pool "
            "(--max-total-tokens / --mem-fraction-static)"
        )
