"""--decode-log-interval: a periodic line with batch size, KV usage and throughput, as SGLang
logs it ("Decode batch. #running-req: ..., gen throughput (token/s): ...")."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


class DecodeLogger:
    def __init__(self, interval: int | None, info: Callable[[], dict[str, Any]]) -> None:
        self.interval = interval or 0
        self.info = info  # the scheduler's live state (Scheduler.info)
        self.steps = 0
        self.tokens = 0
        self.since = time.monotonic()

    def step(self, batch_size: int) -> None:
        if self.interval <= 0:
            return
        self.steps += 1
        self.tokens += batch_size
        if self.steps % self.interval:
            return
        now = time.monotonic()
        throughput = self.tokens / max(now - self.since, 1e-9)
        info = self.info()
        logger.info(
            "Decode batch. #running-req: %d, #queue-req: %d, token usage: %.2f, "
            "cache hit rate: %.2f, gen throughput (token/s): %.2f",
            info["num_running_reqs"],
            info["num_waiting_reqs"],
            info["token_usage"],
            info["cache_hit_rate"],
            throughput,
        )
        self.tokens = 0
        self.since = now
