"""SGLang's MoE expert distribution routes: /start_expert_distribution_record,
/stop_expert_distribution_record and /dump_expert_distribution_record (GET or POST), answered
with SGLang's plain-text lines. They need --expert-distribution-recorder-mode stat (else 400)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from starlette.requests import Request

from radixserve.entrypoints.generation import call_engine
from radixserve.entrypoints.openai.errors import ApiError
from radixserve.entrypoints.serving_context import get_ctx
from radixserve.errors import InvalidRequestError

ROUTES = {
    "/start_expert_distribution_record": (
        "start_expert_distribution_record",
        "Start recording the expert distribution.\n",
    ),
    "/stop_expert_distribution_record": (
        "stop_expert_distribution_record",
        "Stop recording the expert distribution.\n",
    ),
    "/dump_expert_distribution_record": (
        "dump_expert_distribution_record",
        "Dump expert distribution record.\n",
    ),
}


def _handler(method_name: str, text: str):
    async def endpoint(request: Request) -> Response:
        method = getattr(get_ctx(request).engine, method_name, None)
        if method is None:
            raise ApiError(501, f"This engine does not support {method_name}.")
        try:
            await call_engine(method)
        except InvalidRequestError as exc:  # the recorder is off
            raise ApiError(400, str(exc)) from exc
        return Response(text, status_code=200, media_type="text/plain")

    endpoint.__name__ = method_name
    return endpoint


def build_router() -> APIRouter:
    router = APIRouter()
    for path, (method_name, text) in ROUTES.items():
        for method in ("GET", "POST"):
            router.add_api_route(path, _handler(method_name, text), methods=[method])
    return router
