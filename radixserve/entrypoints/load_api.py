"""GET /get_load: SGLang's per-data-parallel-rank load report. sglang-router polls it to balance
its workers (power_of_two) and to show each worker's load on the router's /get_loads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from radixserve.entrypoints.generation import call_engine
from radixserve.entrypoints.serving_context import get_ctx


def load_entries(states: Sequence[Mapping[str, Any]]) -> list[dict[str, int]]:
    """One SGLang GetLoadReqOutput per scheduler state (one per data-parallel rank)."""
    return [
        {
            "dp_rank": rank,
            "num_reqs": int(state.get("num_reqs", 0)),
            "num_waiting_reqs": int(state.get("num_waiting_reqs", 0)),
            "num_tokens": int(state.get("num_tokens", 0)),
        }
        for rank, state in enumerate(states)
    ]


async def get_load(request: Request) -> Response:
    info = dict(await call_engine(get_ctx(request).engine.get_server_info))
    states = info.get("internal_states") or [info]
    return JSONResponse(load_entries(states))
