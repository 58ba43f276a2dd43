"""SGLang's native routes: health, model and server info, cache flush, abort, version, plus
/generate (native_generate.py) and the hidden /tokenize, /detokenize and /encode aliases."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

import radixserve
from radixserve.entrypoints.engine_inputs import GenerateCall
from radixserve.entrypoints.generation import call_engine
from radixserve.entrypoints.load_api import get_load
from radixserve.entrypoints.native_generate import generate
from radixserve.entrypoints.openai.errors import ApiError
from radixserve.entrypoints.openai.protocol import AbortRequestInput, EncodeReqInput
from radixserve.entrypoints.openai.serving_embedding import encode
from radixserve.entrypoints.openai.serving_tokenize import detokenize, tokenize
from radixserve.entrypoints.openapi_bodies import body_doc, generate_body_doc
from radixserve.entrypoints.request_body import parse_model, read_json
from radixserve.entrypoints.serving_context import ServingContext, get_ctx
from radixserve.entrypoints.web.pages import PLAYGROUND, page_response, wants_html

logger = logging.getLogger(__name__)

HEALTH_CHECK_RID_PREFIX = "HEALTH_CHECK"
_SECRET_ARGS = ("api_key", "admin_api_key", "ssl_keyfile_password")
FLUSHED = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or "
    "waiting requests, the operation will not be performed.)\n"
)


def _unavailable(ctx: ServingContext) -> ApiError | None:
    is_alive = getattr(ctx.engine, "is_alive", None)
    if callable(is_alive) and not is_alive():
        return ApiError(503, "The engine is not running.", headers={"Retry-After": "1"})
    if not ctx.state.ready:
        return ApiError(503, "The server is starting up.", headers={"Retry-After": "1"})
    reason = ctx.state.unavailable_reason()
    if reason is not None:
        return ApiError(503, reason, headers={"Retry-After": "1"})
    return None


async def _generate_one_token(ctx: ServingContext) -> bool:
    rid = f"{HEALTH_CHECK_RID_PREFIX}_{uuid.uuid4().hex}"
    try:
        call = GenerateCall(
            input_ids=[0], sampling_params={"max_new_tokens": 1, "temperature": 0}, rid=rid
        )
        result = await asyncio.wait_for(
            ctx.engine.async_generate_outputs(call), timeout=ctx.config.health_timeout_s
        )
    except Exception:
        logger.warning("Health check generation failed", exc_info=True)
        return False
    return not result.meta_info.aborted


async def health(request: Request) -> Response:
    ctx = get_ctx(request)
    error = _unavailable(ctx)
    if error is not None:
        return error.response()
    if ctx.config.health_generates:
        return await health_generate(request)
    # SGLang answers an empty 200; a small body lets curl users see it.
    return JSONResponse({"status": "ok"})


async def health_generate(request: Request) -> Response:
    ctx = get_ctx(request)
    error = _unavailable(ctx)
    if error is not None:
        return error.response()
    if await _generate_one_token(ctx):
        return Response(status_code=200)
    return ApiError(503, "The engine did not answer a one-token generation.").response()


def _model_type(cfg: Any) -> str | None:
    """From the model config, or the config.json of the folder the engine loaded."""
    value = getattr(cfg, "model_type", None) or getattr(
        getattr(cfg, "hf_config", None), "model_type", None
    )
    folder = getattr(cfg, "model_dir", None)
    if value is None and folder:
        try:
            value = json.loads((Path(folder) / "config.json").read_text()).get("model_type")
        except (OSError, ValueError):
            value = None
    return value


async def model_info(request: Request) -> Response:
    ctx = get_ctx(request)
    cfg = ctx.model_config
    return JSONResponse(
        {
            "model_path": ctx.config.model_path,
            "tokenizer_path": ctx.config.tokenizer_path,
            "is_generation": not ctx.config.is_embedding,
            "preferred_sampling_params": ctx.config.preferred_sampling_params,
            "weight_version": ctx.config.weight_version,
            "has_image_understanding": ctx.takes_images,
            "has_audio_understanding": False,
            "model_type": _model_type(cfg),
            "architectures": list(getattr(cfg, "architectures", None) or []) or None,
        }
    )


def _args_dict(server_args: Any) -> dict[str, Any]:
    """Every server argument as JSON, at the top level as SGLang lists them: the options
    without a typed field (ServerArgs.other, a read-only mapping) join the others instead of
    showing as one stringified object."""
    if dataclasses.is_dataclass(server_args) and not isinstance(server_args, type):
        raw = {f.name: getattr(server_args, f.name) for f in dataclasses.fields(server_args)}
    else:
        raw = {k: v for k, v in vars(server_args).items() if not k.startswith("_")}
    other = raw.pop("other", None)
    if isinstance(other, Mapping):
        raw.update({k: v for k, v in other.items() if k not in raw})
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _SECRET_ARGS and value:
            value = "<redacted>"
        out[key] = _jsonable(value)
    return out


def _jsonable(value: Any) -> Any:
    """`value` as JSON types: mappings as objects, sequences as lists, anything else JSON
    cannot hold as its string."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


async def server_info(request: Request) -> Response:
    ctx = get_ctx(request)
    live = dict(await call_engine(ctx.engine.get_server_info))
    if "cache_hit_rate" not in live:
        live["cache_hit_rate"] = ctx.metrics.cache_hit_rate() if ctx.metrics else 0.0
    live["num_inflight_http_reqs"] = ctx.state.inflight
    # With --dp-size the engine answers one state per replica (SGLang: one per dp rank).
    states = live.pop("internal_states", None) or [live]
    body = {
        **_args_dict(ctx.server_args),
        **live,
        "internal_states": states,
        "version": radixserve.__version__,
    }
    return JSONResponse(body)


async def flush_cache(request: Request) -> Response:
    ctx = get_ctx(request)
    ok = await call_engine(ctx.engine.flush_cache)
    if not ok:
        return ApiError(400, "Cache not flushed: there are running or waiting requests.").response()
    return Response(FLUSHED, status_code=200, media_type="text/plain")


async def abort_request(request: Request) -> Response:
    ctx = get_ctx(request)
    req = parse_model(AbortRequestInput, await read_json(request))
    if not req.abort_all and not req.rid:
        raise ApiError(400, "Give a rid to abort, or abort_all=true.", param="rid")
    ctx.engine.abort_request(rid=req.rid or None, abort_all=req.abort_all)
    return Response(status_code=200)


async def version(_: Request) -> Response:
    return JSONResponse({"version": radixserve.__version__})


async def root(request: Request) -> Response:
    """The playground for a browser, else a JSON pointer (curl and scripts keep their JSON)."""
    if get_ctx(request).config.enable_web_ui and wants_html(request.headers.get("accept")):
        return page_response(PLAYGROUND)
    prefix = request.scope.get("root_path", "")
    return JSONResponse(
        {
            "name": "radixserve",
            "version": radixserve.__version__,
            "docs": f"{prefix}/docs",
            "openapi": f"{prefix}/openapi.json",
            "openai_api": f"{prefix}/v1",
            "health": f"{prefix}/health",
        }
    )


def build_router() -> APIRouter:
    router = APIRouter()
    router.add_api_route("/", root, methods=["GET"], include_in_schema=False)
    # One route per method: each gets its own OpenAPI operation id.
    for method in ("POST", "PUT"):
        router.add_api_route(
            "/generate", generate, methods=[method], openapi_extra=generate_body_doc()
        )
        router.add_api_route(
            "/encode", encode, methods=[method], openapi_extra=body_doc(EncodeReqInput)
        )
    router.add_api_route("/health", health, methods=["GET"])
    router.add_api_route("/health_generate", health_generate, methods=["GET"])
    for path in ("/model_info", "/get_model_info"):
        router.add_api_route(path, model_info, methods=["GET"])
    for path in ("/server_info", "/get_server_info"):
        router.add_api_route(path, server_info, methods=["GET"])
    router.add_api_route("/get_load", get_load, methods=["GET"])
    for method in ("GET", "POST"):
        router.add_api_route("/flush_cache", flush_cache, methods=[method])
    router.add_api_route(
        "/abort_request", abort_request, methods=["POST"], openapi_extra=body_doc(AbortRequestInput)
    )
    router.add_api_route("/tokenize", tokenize, methods=["POST"], include_in_schema=False)
    router.add_api_route("/detokenize", detokenize, methods=["POST"], include_in_schema=False)
    router.add_api_route("/version", version, methods=["GET"])
    return router
