"""Modules a plain install runs (the CLI's chat client, the server) import only declared
dependencies: `radixserve chat --url` once crashed with ModuleNotFoundError: httpx after the
README's install, because only the test extra brought httpx in (issue 31)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Import name -> distribution name, where they differ.
DISTRIBUTIONS = {"yaml": "pyyaml", "zmq": "pyzmq", "prometheus_client": "prometheus-client"}
CHECKED = ("radixserve/chat_backends.py", "radixserve/chat_cli.py", "radixserve/cli.py")


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = set()
    for requirement in project["dependencies"]:
        names.add(re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower())
    return names


def _top_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("module", CHECKED)
def test_imports_are_declared_dependencies(module: str) -> None:
    declared = _declared()
    third_party = {
        name
        for name in _top_level_imports(ROOT / module)
        if name not in sys.stdlib_module_names and name not in ("radixserve", "__future__")
    }
    missing = sorted(n for n in third_party if DISTRIBUTIONS.get(n, n).lower() not in declared)
    assert not missing, f"{module} imports {missing}, which pyproject.toml does not declare"
