"""/dashboard/state: one JSON poll for the dashboard, built from the engine snapshot and the
counters that /metrics reads (metrics.engine_gauges and ServingMetrics.totals)."""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi.responses import JSONResponse
from starlette.requests import Request

from radixserve.entrypoints.generation import call_engine
from radixserve.entrypoints.serving_context import get_ctx
from radixserve.observability.expert_metrics import dashboard_rows
from radixserve.observability.metrics import engine_gauges

logger = logging.getLogger(__name__)


async def dashboard_state(request: Request) -> JSONResponse:
    ctx = get_ctx(request)
    try:
        info = dict(await call_engine(ctx.engine.get_server_info))
    except Exception:  # the dashboard should show "engine unreachable", not a 500 page
        logger.warning("Could not read engine state for the dashboard", exc_info=True)
        info = {}
    try:
        tree = await call_engine(ctx.engine.get_radix_tree) if info else None
    except Exception:
        logger.warning("Could not read the radix tree for the dashboard", exc_info=True)
        tree = None
    hit_rate = ctx.metrics.cache_hit_rate() if ctx.metrics else 0.0
    body: dict[str, Any] = {
        "time": time.time(),
        "model": ctx.config.served_model_name,
        # "prefill" / "decode" under PD disaggregation (docs/scaling.md), else None.
        "role": _role(info),
        "engine_reachable": bool(info),
        "max_running_requests": info.get("max_running_requests"),
        "inflight_http_requests": ctx.state.inflight,
        "gauges": engine_gauges(info, hit_rate),
        "totals": ctx.metrics.totals() if ctx.metrics else {},
        # None when the radix cache is off (--disable-radix-cache) or the engine is unreachable.
        "radix_tree": tree,
        # None unless --expert-distribution-recorder-mode is set.
        "expert_load": dashboard_rows(info),
    }
    return JSONResponse(body)


def _role(info: dict[str, Any]) -> str | None:
    mode = info.get("disaggregation_mode")
    return None if mode in (None, "null") else str(mode)
