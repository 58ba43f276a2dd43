"""Give freed heap memory back to the OS.

glibc keeps freed blocks in the process heap for reuse. Loading a model leaves a lot there
(float weights converted and dropped by --quantization, temporary tensors of the load and the
first batches): 133 MB of a 727 MB GGUF scheduler process measured idle, which the RSS keeps
counting until `malloc_trim` hands the pages back. Other C libraries: a no-op.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable
from functools import cache

logger = logging.getLogger(__name__)


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the C library the process already runs on
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_free_heap() -> bool:
    """Return the heap's free pages to the OS; False where the C library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


class IdleHeapRelease:
    """Calls release_free_heap when a loop goes idle after work, at most once per
    `min_interval_s` (the trim walks the heap, and pages given back fault in again on reuse)."""

    def __init__(self, min_interval_s: float = 2.0) -> None:
        self.min_interval_s = min_interval_s
        self._worked_since_release = True  # the first idle moment follows start-up
        self._last_release = float("-inf")

    def observe(self, busy: bool) -> bool:
        """Report the loop's state; True when this call released the heap."""
        if busy:
            self._worked_since_release = True
            return False
        now = time.monotonic()
        if not self._worked_since_release or now - self._last_release < self.min_interval_s:
            return False
        self._worked_since_release = False
        self._last_release = now
        started = time.perf_counter()
        released = release_free_heap()
        logger.debug("Heap released to the OS in %.1f ms", 1e3 * (time.perf_counter() - started))
        return released
