"""The HTTP server: `create_app(engine, server_args)` builds the FastAPI app on top of an
`Engine`; `launch_server(server_args)` builds the engine and serves the app with uvicorn.

Lifecycle: the port opens once the engine is built; /health answers 503 until a warmup
generation has passed. SIGTERM (or Ctrl-C) starts a drain: new requests and /health get 503,
in-flight requests may finish within the grace period, then the server exits 0. An engine that
dies (`engine.is_alive()` turning false, or a failed warmup) makes /health 503 and the server
exit 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response
from starlette.requests import Request

from radixserve import __version__
from radixserve.entrypoints import control_api, expert_api, lora_api, native_api
from radixserve.entrypoints.auth import ApiKeyMiddleware
from radixserve.entrypoints.engine_inputs import GenerateCall
from radixserve.entrypoints.engine_start import start_engine
from radixserve.entrypoints.generation import GenerationRunner, call_engine
from radixserve.entrypoints.http_config import HttpConfig
from radixserve.entrypoints.http_state import ServerState
from radixserve.entrypoints.openai import routes as openai_routes
from radixserve.entrypoints.openai.chat_template import load_chat_template
from radixserve.entrypoints.openai.errors import install_error_handlers
from radixserve.entrypoints.request_body import BodyLimitMiddleware
from radixserve.entrypoints.request_log import RequestLogger
from radixserve.entrypoints.serving_context import ServingContext, get_ctx
from radixserve.entrypoints.web import routes as web_routes
from radixserve.observability.metrics import CONTENT_TYPE, ServingMetrics
from radixserve.utils.heap import release_free_heap

logger = logging.getLogger(__name__)

WARMUP_PROMPT = "The capital city of France is"
ENGINE_WATCH_S = 1.0


async def _metrics_route(request: Request) -> Response:
    ctx = get_ctx(request)
    assert ctx.metrics is not None
    try:
        snapshot = await call_engine(ctx.engine.get_server_info)
    except Exception:  # a scrape must still answer when the engine is busy or gone
        logger.warning("Could not read engine state for /metrics", exc_info=True)
        snapshot = {}
    return Response(ctx.metrics.render(snapshot), media_type=CONTENT_TYPE)


async def _learn_capacity(ctx: ServingContext) -> None:
    capacity = ctx.config.max_running_requests
    if capacity is None:
        try:
            info = await call_engine(ctx.engine.get_server_info)
            capacity = info.get("max_running_requests")
        except Exception:
            logger.warning("Could not read max_running_requests from the engine", exc_info=True)
    ctx.state.running_capacity = int(capacity or 0)


async def _warmup(ctx: ServingContext) -> None:
    await _learn_capacity(ctx)
    if ctx.config.skip_server_warmup:
        ctx.state.ready = True
        return
    params = {"max_new_tokens": 1, "temperature": 0}
    prompt: dict[str, Any] = (
        {"prompt": WARMUP_PROMPT} if ctx.tokenizer is not None else {"input_ids": [10, 11, 12]}
    )
    try:
        if ctx.config.is_embedding:
            await ctx.engine.async_encode_outputs(**prompt)
        else:
            await ctx.engine.async_generate_outputs(GenerateCall(**prompt, sampling_params=params))
    except Exception:
        logger.exception("The warmup generation failed")
        _mark_dead(ctx, "warmup failed")
        return
    ctx.state.ready = True
    # Start-up (tokenizer, chat template, warm-up) leaves ~30 MB freed in this process's heap.
    release_free_heap()
    logger.info("The server is ready to roll!")


def _mark_dead(ctx: ServingContext, reason: str) -> None:
    ctx.state.dead_reason = reason
    if ctx.on_fatal is not None:
        ctx.on_fatal()


async def _watch_engine(ctx: ServingContext) -> None:
    is_alive = getattr(ctx.engine, "is_alive", None)
    if not callable(is_alive):
        return
    while ctx.state.dead_reason is None:
        await asyncio.sleep(ENGINE_WATCH_S)
        if not is_alive():
            logger.error("The engine died; the server will exit")
            _mark_dead(ctx, "engine died")


def _lifespan(ctx: ServingContext) -> Any:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(_warmup(ctx)), asyncio.create_task(_watch_engine(ctx))]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    return lifespan


def prepare() -> None:
    """Build the routers once (and throw them away): their OpenAPI body schemas are cached, so
    `create_app`, which waits on the model, no longer computes them (entrypoints/launch.py calls
    this while the model loads)."""
    native_api.build_router()
    control_api.build_router()
    openai_routes.build_router()
    lora_api.build_router()


def create_app(engine: Any, server_args: Any) -> FastAPI:
    """The app for `engine`; raises ValueError naming the option when the settings are bad."""
    config = HttpConfig.from_server_args(server_args)
    metrics = ServingMetrics(config.served_model_name)
    ctx = ServingContext(
        engine=engine,
        server_args=server_args,
        config=config,
        state=ServerState(config),
        runner=GenerationRunner(engine, metrics),
        metrics=metrics,
        request_log=RequestLogger(config.log_requests, config.log_requests_level),
        chat_template=load_chat_template(config.chat_template),
    )
    app = FastAPI(
        title="radixserve",
        lifespan=_lifespan(ctx),
        root_path=config.root_path,
        version=__version__,
        # FastAPI's own /openapi.json and /docs, as SGLang and vLLM serve them.
        openapi_url="/openapi.json",
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.ctx = ctx
    install_error_handlers(app)
    app.include_router(native_api.build_router())
    app.include_router(control_api.build_router())
    app.include_router(expert_api.build_router())
    app.include_router(openai_routes.build_router())
    if lora_api.lora_enabled(engine):
        app.include_router(lora_api.build_router())
    if config.enable_metrics:
        app.add_api_route("/metrics", _metrics_route, methods=["GET"])
    if config.enable_web_ui:
        app.include_router(web_routes.build_router())
    # add_middleware puts the newest outermost: auth runs first, before a body is read.
    app.add_middleware(BodyLimitMiddleware, limit=config.max_body_bytes)
    if config.api_key or config.admin_api_key:
        app.add_middleware(
            ApiKeyMiddleware,
            api_key=config.api_key,
            admin_api_key=config.admin_api_key,
            root_path=config.root_path,
            open_pages=config.enable_web_ui,
        )
    # As SGLang: browsers may call the API from any origin (preflights pass auth untouched).
    app.add_middleware(
        CORSMiddleware,
        allow_origins=["*"],
        allow_credentials=True,
        allow_methods=["*"],
        allow_headers=["*"],
    )
    return app


class DrainingServer(uvicorn.Server):
    """uvicorn with a drain on the first SIGTERM/SIGINT (a second one stops at once) and
    without uvicorn's re-raise of the signal after shutdown, so a drained exit is status 0."""

    def __init__(self, config: uvicorn.Config, ctx: ServingContext) -> None:
        super().__init__(config)
        self.ctx = ctx
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None
        ctx.on_fatal = self._stop

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def _stop(self) -> None:
        self.should_exit = True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.ctx.state.draining or self._loop is None:
            logger.warning("Second %s: stopping now", signal.Signals(sig).name)
            self.should_exit = True
            self.force_exit = True
            return
        logger.info("%s received: draining", signal.Signals(sig).name)
        self.ctx.state.draining = True
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        async def drain() -> None:
            await self.ctx.state.drain(self.ctx.config.graceful_shutdown_s)
            self.should_exit = True

        self._drain_task = asyncio.ensure_future(drain())


class _PathPrefixFilter(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        path = str(args[2]) if len(args) > 2 else ""
        return not path.startswith(self.prefixes)


def _uvicorn_config(app: FastAPI, config: HttpConfig) -> uvicorn.Config:
    if bool(config.ssl_keyfile) != bool(config.ssl_certfile):
        raise ValueError("--ssl-keyfile and --ssl-certfile must be given together.")
    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=(config.log_level_http or config.log_level).lower(),
        ssl_keyfile=config.ssl_keyfile,
        ssl_certfile=config.ssl_certfile,
        timeout_keep_alive=5,
        timeout_graceful_shutdown=int(config.graceful_shutdown_s),
        lifespan="on",
    )


def launch_server(server_args: Any) -> None:
    """Build the engine and serve until SIGTERM; SystemExit(1) when the engine fails.
    (`radixserve serve` goes through entrypoints/launch.py, which starts the engine while this
    module is still being imported.)"""
    serve(start_engine(server_args), server_args)


def serve(engine: Any, server_args: Any) -> None:
    """Serve the app over the started `engine` until SIGTERM, then shut the engine down."""
    config = HttpConfig.from_server_args(server_args)
    cpu_plan = getattr(engine.runtime, "cpu_plan", None)
    if cpu_plan is not None:  # the model runs in child processes: keep off their cores
        from radixserve.utils.cpu_threads import run_light

        run_light(cpu_plan)
    try:
        app = create_app(engine, server_args)
        server = DrainingServer(_uvicorn_config(app, config), app.state.ctx)
        if config.access_log_exclude_prefixes:
            logging.getLogger("uvicorn.access").addFilter(
                _PathPrefixFilter(config.access_log_exclude_prefixes)
            )
        from radixserve.entrypoints.banner import startup_banner

        host = f"[{config.host}]" if ":" in config.host else config.host
        url = f"http://{host}:{config.port}{config.root_path or ''}"
        logger.info("%s", startup_banner(server_args, engine.runtime.ready, cpu_plan, url))
        from radixserve.sampling.constrained.registry import describe_grammar_backend

        logger.log(*describe_grammar_backend(server_args.grammar_backend))
        server.run()
    finally:
        engine.shutdown()
    if app.state.ctx.state.dead_reason is not None:
        raise SystemExit(1)
