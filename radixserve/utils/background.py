"""Start-up work that runs on a thread beside the model load (the scheduler's tokenizer). Kernel
timings call `wait_for_start_up_work` first: a thread importing modules on the same cores would
skew the measurement the kernel choice rests on."""

from __future__ import annotations

import threading
from collections.abc import Callable

_threads: list[threading.Thread] = []
_lock = threading.Lock()


def start_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """Run `target` on a daemon thread, registered as start-up work."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    with _lock:
        _threads[:] = [t for t in _threads if t.is_alive()]
        _threads.append(thread)
    thread.start()
    return thread


def wait_for_start_up_work() -> None:
    """Return once every registered start-up thread has finished (not from one of them)."""
    with _lock:
        pending = [t for t in _threads if t.is_alive() and t is not threading.current_thread()]
    for thread in pending:
        thread.join()
