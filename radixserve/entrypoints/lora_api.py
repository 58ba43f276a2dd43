"""SGLang's /load_lora_adapter and /unload_lora_adapter (admin routes: entrypoints/auth.py).

Served only when the server runs with --enable-lora (or --lora-paths); otherwise the paths are
plain 404s, as before. A runtime-loaded adapter's folder must lie inside the allowed folders
(radixserve.lora.registry); every refusal is a 400 with OpenAI's error body.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, StrictBool, StrictStr
from starlette.requests import Request

from radixserve.entrypoints.generation import call_engine
from radixserve.entrypoints.openai.errors import ApiError
from radixserve.entrypoints.openapi_bodies import body_doc
from radixserve.entrypoints.request_body import read_model
from radixserve.entrypoints.serving_context import get_ctx
from radixserve.errors import InvalidRequestError


class LoadLoRAAdapterInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: StrictStr
    lora_path: StrictStr
    pinned: StrictBool = False


class UnloadLoRAAdapterInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: StrictStr


def lora_enabled(engine: Any) -> bool:
    registry = getattr(engine, "lora", None)
    return bool(getattr(registry, "enabled", False))


async def _answer(fn: Any, *args: Any) -> Response:
    try:
        result = await call_engine(fn, *args)
    except InvalidRequestError as exc:
        raise ApiError(400, str(exc), param=exc.param) from exc
    body = {
        "success": True,
        "error_message": "",
        "loaded_adapters": result.get("loaded_adapters", {}),
    }
    return JSONResponse(body)


async def load_lora_adapter(request: Request) -> Response:
    ctx = get_ctx(request)
    req = await read_model(request, LoadLoRAAdapterInput)
    return await _answer(ctx.engine.load_lora_adapter, req.lora_name, req.lora_path, req.pinned)


async def unload_lora_adapter(request: Request) -> Response:
    ctx = get_ctx(request)
    req = await read_model(request, UnloadLoRAAdapterInput)
    return await _answer(ctx.engine.unload_lora_adapter, req.lora_name)


def build_router() -> APIRouter:
    router = APIRouter()
    router.add_api_route(
        "/load_lora_adapter",
        load_lora_adapter,
        methods=["POST"],
        openapi_extra=body_doc(LoadLoRAAdapterInput),
    )
    router.add_api_route(
        "/unload_lora_adapter",
        unload_lora_adapter,
        methods=["POST"],
        openapi_extra=body_doc(UnloadLoRAAdapterInput),
    )
    return router
