"""Child-process plumbing: die with the parent, socket addresses, logging in children."""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
PARENT_POLL_S = 1.0


def die_with_parent(parent_pid: int) -> None:
    """Make this child exit when the parent dies, even by SIGKILL.

    Linux delivers PR_SET_PDEATHSIG when the parent thread exits; a watcher thread also polls
    the parent pid, which covers the race where the parent died before prctl ran and platforms
    without prctl.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            logger.debug("prctl is not available; relying on the parent watcher")
    if os.getppid() != parent_pid:
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(PARENT_POLL_S)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="parent-watcher", daemon=True).start()


def ipc_address(folder: Path, name: str) -> str:
    return f"ipc://{folder / name}"


def configure_child_logging(level: str, name: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format=f"[%(asctime)s {name}] %(levelname)s %(name)s: %(message)s",
    )


def apply_gc_threshold(threshold: tuple[int, ...] | None) -> None:
    """--gc-threshold: Python's collector thresholds, for each of our processes."""
    if threshold:
        gc.set_threshold(*threshold)
