"""Side-by-side timing for the startup choices between kernels (layers/fast_path.py,
layers/kquant_paths.py)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def interleaved_medians(calls: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Each call's median time over `rounds` rounds that run the calls in turn (so a machine
    that slows down mid-way slows every candidate alike), after a warm-up round."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds + 1):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(times[1:]) for name, times in samples.items()}
