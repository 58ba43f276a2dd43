"""A plain `pip install .` must give working structured outputs (issue 11): llguidance is a core
dependency, and an unset --grammar-backend is the first installed backend, logged at startup."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import tomllib
from pathlib import Path
from typing import Any

import pytest

from radixserve.options import resolve as resolve_mod
from radixserve.options.resolve import GRAMMAR_BACKEND_PREFERENCE, default_grammar_backend
from radixserve.sampling.constrained.registry import (
    GRAMMAR_BACKENDS,
    available_grammar_backends,
    describe_grammar_backend,
)

ROOT = Path(__file__).resolve().parents[2]


def hide(monkeypatch: pytest.MonkeyPatch, *missing: str) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name in missing else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_llguidance_is_a_core_dependency_without_dependencies_of_its_own() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = [d.split(">")[0].split("=")[0].strip() for d in project["dependencies"]]
    assert "llguidance" in core
    # One wheel, nothing else: no torch build or triton comes with it.
    assert not importlib.metadata.requires("llguidance")


def test_the_default_is_the_first_installed_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    assert sorted(name for name, _ in GRAMMAR_BACKEND_PREFERENCE) == sorted(GRAMMAR_BACKENDS)
    installed = available_grammar_backends()
    assert default_grammar_backend() == installed[0]
    hide(monkeypatch, "xgrammar")  # `pip install .` without scripts/install.sh
    assert default_grammar_backend() == "llguidance"
    hide(monkeypatch, "xgrammar", "llguidance", "outlines_core")
    assert default_grammar_backend() == "xgrammar"  # its error then names the package


def test_server_args_pick_the_installed_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    from radixserve.server_args import ServerArgs

    hide(monkeypatch, "xgrammar")
    assert resolve_mod.default_grammar_backend() == "llguidance"
    args = ServerArgs.from_kwargs(model_path="some/model", device="cpu")
    assert args.grammar_backend == "llguidance"
    chosen = ServerArgs.from_kwargs(
        model_path="some/model", device="cpu", grammar_backend="outlines"
    )
    assert chosen.grammar_backend == "outlines"


def test_startup_line_names_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    level, message = describe_grammar_backend("llguidance")
    assert level == logging.INFO and "llguidance grammar backend" in message
    hide(monkeypatch, "xgrammar")
    level, message = describe_grammar_backend("xgrammar")
    assert level == logging.WARNING and "install xgrammar" in message
    assert describe_grammar_backend("none")[1].startswith("Structured outputs are disabled")
