"""Side-by-side timing for the startup choices between kernels (layers/fast_path.py,
layers/kquant_paths.py)."""

from __future__ import annotations

import time
from collections.abc import Callable


def interleaved_fastest(calls: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Each call's fastest time over `rounds` rounds that run the calls in turn (so a machine
    that slows down mid-way slows every candidate alike), after a warm-up round. The fastest,
    not the median: another process taking a core only ever adds time (a 2-thread kernel waits
    at its barrier for the thread that lost its core), and on a busy 2-core machine most rounds
    can be hit, which once made the median call a 4x faster panel GEMM "no faster"."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds + 1):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            samples[name].append(time.perf_counter() - start)
    return {name: min(times[1:]) for name, times in samples.items()}
