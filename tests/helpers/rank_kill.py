"""Kill one rank's process under a running stream and check the engine goes down cleanly."""

from __future__ import annotations

import os
import signal
import time
from typing import Any


def assert_rank_kill_ends_engine(engine: Any, victim: int, name: str, timeout_s: float) -> None:
    """SIGKILL engine.runtime.processes[victim] (named `name`) mid-stream: the stream ends with
    an abort, rank 0 exits non-zero within `timeout_s` (+10 s), and the engine reports dead."""
    scheduler, target = engine.runtime.processes[0], engine.runtime.processes[victim]
    assert target.name == name
    stream = engine.generate(
        input_ids=[5, 6, 7],
        sampling_params={"max_new_tokens": 500, "ignore_eos": True},  # the context is 512
        stream=True,
    )
    next(stream)
    os.kill(target.pid, signal.SIGKILL)
    chunks = list(stream)
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    # Rank 0 notices on its own (a failed collective or send), well within --dist-timeout.
    scheduler.join(timeout=timeout_s + 10)
    assert scheduler.exitcode not in (None, 0)
    deadline = time.monotonic() + 5
    while engine.is_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not engine.is_alive()
