"""`radixserve serve`'s start-up order: the engine's processes first, the HTTP stack meanwhile.

The scheduler process's start (torch, the model) is the longest path to a ready server, and it
cannot begin before this process spawns it. Importing the HTTP stack first (FastAPI, uvicorn,
pydantic, the routes: ~0.35 s on a quiet 2-core machine) delayed the spawn by that much, so it
is imported on a thread, started once the Engine has spawned its processes (before, it
delayed the spawn: it shares this process's GIL), at a lower CPU priority (the scheduler's
start comes first on the cores), while the main thread waits for the model.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import threading
from types import ModuleType
from typing import Any

logger = logging.getLogger(__name__)

HTTP_SERVER = "radixserve.entrypoints.http_server"
# What the HTTP server needs beyond radixserve itself (checked before anything starts).
HTTP_PACKAGES = ("fastapi", "uvicorn", "starlette")


def missing_http_stack() -> str | None:
    """The name of the first missing piece of the HTTP stack, or None when all are there."""
    for name in (HTTP_SERVER, *HTTP_PACKAGES):
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except (ImportError, ValueError):
            return name
    return None


class _BackgroundImport:
    """A module imported on a daemon thread from `start()`; `module()` waits for it (and
    re-raises what the import raised), importing it there if it was never started."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="import-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        from radixserve.utils.cpu_threads import yield_cpu_to_the_model

        yield_cpu_to_the_model()  # this thread's priority only
        self._import()

    def _import(self) -> None:
        try:
            module = importlib.import_module(self._name)
            prepare = getattr(module, "prepare", None)
            if callable(prepare):  # work the module can do before the engine is up
                prepare()
            self._module = module
        except BaseException as exc:  # handed to the thread that waits
            self._error = exc

    def module(self) -> ModuleType:
        if self._thread.ident is None:  # never started: import here
            self._import()
        else:
            self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._module is not None
        return self._module


def launch_server(server_args: Any) -> None:
    """Start the engine, then serve it over HTTP until SIGTERM (as http_server.launch_server);
    SystemExit(1) when either cannot start."""
    from radixserve.entrypoints.engine_start import start_engine

    http = _BackgroundImport(HTTP_SERVER)
    engine = start_engine(server_args, on_spawned=http.start)
    try:
        http_server = http.module()
    except Exception as exc:
        logger.error("The HTTP server is not available (%s)", exc)
        engine.shutdown()
        raise SystemExit(1) from None
    http_server.serve(engine, server_args)
