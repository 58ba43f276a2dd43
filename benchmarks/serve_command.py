"""The command line that starts `radixserve serve` for the benchmark scripts (compare.py,
startup_memory.py): this interpreter, loopback host, the given port and model."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path


def radixserve_command(model: Path, port: int, extra: Sequence[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "radixserve",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model-path",
        str(model),
        *extra,
    ]
