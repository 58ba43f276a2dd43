"""--crash-dump-folder: keep the requests of the last few minutes and write them to a file when
a scheduler step crashes, so the failure can be replayed (SGLang dumps the same window)."""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import Any

from radixserve.messages import TokenizedGenerateReq

logger = logging.getLogger(__name__)

WINDOW_S = 300.0  # SGLang keeps the last 5 minutes of requests


class CrashDumper:
    def __init__(self, folder: str, window_s: float = WINDOW_S) -> None:
        self.folder = Path(folder)
        self.window_s = window_s
        self.recent: deque[tuple[float, dict[str, Any]]] = deque()

    def record(self, msg: TokenizedGenerateReq) -> None:
        now = time.time()
        body = asdict(msg)
        body["sampling_params"] = msg.sampling_params.to_dict()  # JSON-safe (sets as lists)
        self.recent.append((now, body))
        while self.recent and now - self.recent[0][0] > self.window_s:
            self.recent.popleft()

    def dump(self, reason: str) -> Path | None:
        """Write the window to a new JSON file; never raises (it runs while handling a crash)."""
        now = time.time()
        requests = [
            {"received_time": t, **req} for t, req in self.recent if now - t <= self.window_s
        ]
        stamp = time.strftime("%Y%m%d_%H%M%S", time.gmtime(now))
        path = self.folder / f"crash_dump_{stamp}_{os.getpid()}_{int(now * 1000) % 1000:03d}.json"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            body = {"reason": reason, "time": now, "requests": requests}
            path.write_text(json.dumps(body, default=str))
        except OSError:
            logger.exception("Could not write the crash dump to %s", self.folder)
            return None
        logger.error("Dumped %d recent requests to %s", len(requests), path)
        return path
