"""How much of a stretch of time this machine's tasks spent waiting for a CPU, from Linux's
pressure stall information (/proc/pressure/cpu, "some" line: cumulative microseconds during
which at least one runnable task waited). A kernel-path timing made while other work held the
cores measures that work, not the kernels (a busy 2-core machine once timed the int8 K-quant
kernels at 0.78x the int16 ones' speed; quiet, 1.87x): such a verdict is used for the start
that measured it but not remembered for later starts."""

from __future__ import annotations

import time
from pathlib import Path

PRESSURE_FILE = Path("/proc/pressure/cpu")


def _stalled_us(path: Path) -> int | None:
    try:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("some "):
                fields = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
                return int(fields["total"])
    except (OSError, KeyError, ValueError):
        return None
    return None


class StallMeter:
    """The share of wall time, between start() and share(), during which some runnable task
    waited for a CPU; None where the kernel does not report it."""

    def __init__(self, path: Path = PRESSURE_FILE) -> None:
        self._path = path
        self._stalled: int | None = None
        self._start = 0.0

    def start(self) -> StallMeter:
        self._stalled = _stalled_us(self._path)
        self._start = time.monotonic()
        return self

    def share(self) -> float | None:
        now = _stalled_us(self._path)
        elapsed = time.monotonic() - self._start
        if now is None or self._stalled is None or elapsed <= 0:
            return None
        return max(0.0, (now - self._stalled) / 1e6 / elapsed)
