"""The scheduler's side of SGLang's expert distribution routes: start, stop and dump the
routing counts of layers/moe/expert_stats.py under --expert-distribution-recorder-mode stat.

A dump is written as SGLang writes it: `expert_distribution_recorder_<unix time>.pt` under
$SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR (default /tmp), a dict with `rank` and
`logical_count` ([layers, experts] int64 counts; rows of dense layers stay zero).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

from radixserve.errors import InvalidRequestError
from radixserve.layers.moe import expert_stats

logger = logging.getLogger(__name__)

ACTIONS = ("start", "stop", "dump")
DIR_ENV = "SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR"


def handle(action: str, mode: str | None) -> str | None:
    """Run one route's action; the dump's path for "dump", else None. Refused (400) when the
    server was not started with a recorder mode, as the counts would silently stay empty."""
    if mode not in expert_stats.RECORDER_MODES:
        raise InvalidRequestError(
            "the expert distribution recorder is off: start the server with "
            "--expert-distribution-recorder-mode stat"
        )
    if action == "start":
        expert_stats.start()
        return None
    if action == "stop":
        expert_stats.stop()
        return None
    if action == "dump":
        return str(dump(Path(os.environ.get(DIR_ENV, "/tmp"))))
    raise InvalidRequestError(f"unknown expert distribution action {action!r}")


def dump(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"expert_distribution_recorder_{time.time()}.pt"
    torch.save({"rank": 0, "logical_count": expert_stats.counts().matrix()}, path)
    logger.info("Dumped the expert distribution record to %s", path)
    return path


def info_fields(mode: str | None) -> dict[str, object]:
    """The scheduler's /server_info (and so /metrics' and the dashboard's) view of the
    counts: `expert_counts` [layers][experts] and whether recording is on; nothing when the
    recorder is off."""
    if mode not in expert_stats.RECORDER_MODES:
        return {}
    return {
        "expert_recording": expert_stats.recording(),
        "expert_counts": expert_stats.counts().matrix().tolist(),
    }
