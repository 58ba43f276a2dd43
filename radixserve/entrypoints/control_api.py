"""SGLang's runtime control routes: /pause_generation, /continue_generation, /open_session,
/close_session, /update_weights_from_disk, /get_weights_by_name, /release_memory_occupation and
/resume_memory_occupation (/abort_request and /flush_cache live in native_api.py). The admin
ones are listed in auth.ADMIN_ROUTES."""

from __future__ import annotations

import dataclasses
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


class UpdateWeightsFromDiskInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    # SGLang can keep the prefix cache; this server always drops it (it was computed with the
    # old weights), so only the default is accepted.
    flush_cache: bool = True


class GetWeightsByNameInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    truncate_size: int = Field(default=100, ge=1)


class MemoryOccupationInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tags: list[str] | None = None


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


async def update_weights_from_disk(request: Request) -> Response:
    body = parse_model(UpdateWeightsFromDiskInput, await read_json(request))
    if not body.flush_cache:
        raise ApiError(
            400,
            "flush_cache=false is not supported: the prefix cache is always dropped.",
            param="flush_cache",
        )
    result = await _call(
        request,
        "update_weights_from_disk",
        body.model_path,
        body.load_format,
        body.abort_all_requests,
    )
    ctx = get_ctx(request)
    if result.get("success") and body.weight_version is not None:
        ctx.config = dataclasses.replace(ctx.config, weight_version=body.weight_version)
    if not result.get("success"):
        # The project's error envelope (SGLang answers {"success": false, "message"}).
        raise ApiError(400, str(result.get("message")), param="model_path")
    return JSONResponse(result)


async def get_weights_by_name(request: Request) -> Response:
    body = parse_model(GetWeightsByNameInput, await read_json(request))
    return JSONResponse(await _call(request, "get_weights_by_name", body.name, body.truncate_size))


async def release_memory_occupation(request: Request) -> Response:
    body = parse_model(MemoryOccupationInput, await read_json(request, allow_empty=True) or {})
    await _call(request, "release_memory_occupation", body.tags)
    return JSONResponse({"success": True, "message": "Memory released; requests wait."})


async def resume_memory_occupation(request: Request) -> Response:
    body = parse_model(MemoryOccupationInput, await read_json(request, allow_empty=True) or {})
    await _call(request, "resume_memory_occupation", body.tags)
    return JSONResponse({"success": True, "message": "Memory resumed."})


def build_router() -> APIRouter:
    router = APIRouter()
    router.add_api_route(
        "/pause_generation",
        pause_generation,
        methods=["POST"],
        openapi_extra=body_doc(PauseGenerationInput),
    )
    router.add_api_route("/continue_generation", continue_generation, methods=["POST"])
    router.add_api_route(
        "/update_weights_from_disk",
        update_weights_from_disk,
        methods=["POST"],
        openapi_extra=body_doc(UpdateWeightsFromDiskInput),
    )
    for method in ("GET", "POST"):
        router.add_api_route(
            "/get_weights_by_name",
            get_weights_by_name,
            methods=[method],
            openapi_extra=body_doc(GetWeightsByNameInput),
        )
        for path, handler in (
            ("/release_memory_occupation", release_memory_occupation),
            ("/resume_memory_occupation", resume_memory_occupation),
        ):
            router.add_api_route(
                path, handler, methods=[method], openapi_extra=body_doc(MemoryOccupationInput)
            )
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
