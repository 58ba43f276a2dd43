"""Files the package needs at run time that are not Python modules (the web UI's pages, the C++
kernel sources built on the user's machine) are declared as package data, so a wheel or a plain
`pip install .` carries them: a file added beside them under another extension would otherwise
be missing from installs while every test run from the source tree still passes."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_DATA_DIRS = ("radixserve/entrypoints/web/static", "radixserve/kernels/csrc")


def test_every_runtime_data_file_is_declared_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["radixserve"]
    files = [
        path.relative_to(ROOT / "radixserve").as_posix()
        for folder in RUNTIME_DATA_DIRS
        for path in (ROOT / folder).iterdir()
        if path.is_file() and path.suffix != ".py"
    ]
    assert files, "no data files found: the folders moved?"
    missing = [f for f in files if not any(fnmatch.fnmatch(f, p) for p in patterns)]
    assert not missing, f"not declared in [tool.setuptools.package-data]: {missing}"
