"""The offline Engine's defaults that differ from the server's."""

from __future__ import annotations

from typing import Any

import pytest

import radixserve.entrypoints.engine as engine_module


class _Started(Exception):
    pass


def _captured_log_level(monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> str:
    seen: list[str] = []

    def fake_runtime(server_args: Any, **_: Any) -> None:
        seen.append(server_args.log_level)
        raise _Started

    monkeypatch.setattr(engine_module, "MultiProcessRuntime", fake_runtime)
    with pytest.raises(_Started):
        engine_module.Engine(**kwargs)
    return seen[0]


def test_engine_logs_errors_only_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    # INFO lines from the child processes would interleave with what the program prints.
    assert _captured_log_level(monkeypatch) == "error"
    assert _captured_log_level(monkeypatch, log_level="info") == "info"
