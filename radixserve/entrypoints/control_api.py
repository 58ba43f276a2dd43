"""SGLang's runtime control routes: /pause_generation, /continue_generation, /open_session and
/close_session (/abort_request and /flush_cache live in native_api.py). The admin ones are
listed in auth.ADMIN_ROUTES."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request

from radixserve.entrypoints.generation import call_engine
from radixserve.entrypoints.openai.errors import ApiError
from radixserve.entrypoints.openapi_bodies import body_doc
from radixserve.entrypoints.request_body import parse_model, read_json
from radixserve.entrypoints.serving_context import get_ctx
from radixserve.errors import InvalidRequestError


class PauseGenerationInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: str = "abort"


class OpenSessionInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    capacity_of_str_len: int | None = Field(default=None, ge=1)
    session_id: str | None = None


class CloseSessionInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    session_id: str


def _engine_method(request: Request, name: str) -> Any:
    method = getattr(get_ctx(request).engine, name, None)
    if method is None:
        raise ApiError(501, f"This engine does not support {name}.")
    return method


async def _call(request: Request, name: str, *args: Any) -> Any:
    try:
        return await call_engine(_engine_method(request, name), *args)
    except InvalidRequestError as exc:  # bad mode, unknown session: the caller's mistake
        raise ApiError(400, str(exc), param=exc.param) from exc


async def pause_generation(request: Request) -> Response:
    body = parse_model(PauseGenerationInput, await read_json(request, allow_empty=True) or {})
    await _call(request, "pause_generation", body.mode)
    return JSONResponse({"success": True, "message": f"Generation paused (mode {body.mode})."})


async def continue_generation(request: Request) -> Response:
    await _call(request, "continue_generation")
    return JSONResponse({"success": True, "message": "Generation continued."})


async def open_session(request: Request) -> Response:
    body = parse_model(OpenSessionInput, await read_json(request, allow_empty=True) or {})
    session_id = await _call(request, "open_session", body.capacity_of_str_len, body.session_id)
    return JSONResponse(session_id)


async def close_session(request: Request) -> Response:
    body = parse_model(CloseSessionInput, await read_json(request))
    await _call(request, "close_session", body.session_id)
    return Response(status_code=200)


def build_router() -> APIRouter:
    router = APIRouter()
    router.add_api_route(
        "/pause_generation",
        pause_generation,
        methods=["POST"],
        openapi_extra=body_doc(PauseGenerationInput),
    )
    router.add_api_route("/continue_generation", continue_generation, methods=["POST"])
    for method in ("GET", "POST"):
        router.add_api_route(
            "/open_session",
            open_session,
            methods=[method],
            openapi_extra=body_doc(OpenSessionInput),
        )
        router.add_api_route(
            "/close_session",
            close_session,
            methods=[method],
            openapi_extra=body_doc(CloseSessionInput),
        )
    return router
