"""--enable-request-time-stats-logging: one log line per finished request with where its time
went (waiting, running, end to end) and its sizes."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixserve.managers.schedule_batch import Req

logger = logging.getLogger(__name__)


def log_time_stats(req: Req, now: float | None = None) -> None:
    now = time.monotonic() if now is None else now
    started = req.first_scheduled_time
    queue_s = (started if started is not None else now) - req.arrival_time
    running_s = now - started if started is not None else 0.0
    reason = req.finished_reason.type if req.finished_reason is not None else "none"
    out_len = len(req.output_ids)
    logger.info(
        "Req Time Stats(rid=%s, input len=%d, output len=%d, cached=%d, finish=%s, "
        "retractions=%d): queue_duration=%.4fs, running_duration=%.4fs, e2e=%.4fs, "
        "decode_tok_per_s=%.1f",
        req.rid,
        len(req.origin_input_ids),
        out_len,
        req.cached_tokens,
        reason,
        req.num_retractions,
        queue_s,
        running_s,
        now - req.arrival_time,
        out_len / running_s if running_s > 0 else 0.0,
    )
