"""`radixserve serve` starts the engine before the HTTP stack is imported (entrypoints/launch.py),
then serves it; a broken HTTP stack stops the started engine."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from radixserve.entrypoints import engine_start, launch


class _Engine:
    def __init__(self) -> None:
        self.shut = False

    def shutdown(self) -> None:
        self.shut = True


def test_the_engine_starts_then_is_served(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _Engine()
    served: list[tuple[Any, Any]] = []
    fake_http = types.ModuleType(launch.HTTP_SERVER)
    fake_http.serve = lambda e, args: served.append((e, args))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, launch.HTTP_SERVER, fake_http)
    order: list[str] = []
    fake_http.prepare = lambda: order.append("prepared")  # type: ignore[attr-defined]

    def start_engine(args: Any, on_spawned: Any) -> _Engine:
        order.append("spawned")
        on_spawned()  # the HTTP stack's import begins once the processes are started
        return engine

    monkeypatch.setattr(engine_start, "start_engine", start_engine)
    launch.launch_server("the args")
    assert served == [(engine, "the args")] and order == ["spawned", "prepared"]
    assert not engine.shut


def test_a_broken_http_stack_stops_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _Engine()
    monkeypatch.setitem(sys.modules, launch.HTTP_SERVER, None)  # its import raises
    monkeypatch.setattr(engine_start, "start_engine", lambda args, on_spawned: engine)
    with pytest.raises(SystemExit) as info:
        launch.launch_server("the args")
    assert info.value.code == 1 and engine.shut


def test_the_http_stack_is_checked_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert launch.missing_http_stack() is None
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    assert launch.missing_http_stack() == "uvicorn"


def test_importing_the_launcher_leaves_the_http_stack_unimported() -> None:
    import os
    import subprocess
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}

    code = (
        "import sys, radixserve.entrypoints.launch, radixserve.entrypoints.engine_start; "
        "print([m for m in ('fastapi', 'uvicorn', 'radixserve.entrypoints.http_server') "
        "if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == "[]"
