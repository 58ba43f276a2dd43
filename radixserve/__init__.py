"""radixserve: an LLM serving engine that speaks SGLang's command line and HTTP API."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from radixserve.entrypoints.engine import Engine


def __getattr__(name: str) -> Any:
    # Importing the engine pulls in torch; keep `import radixserve` (and the CLI's --help) light.
    if name == "Engine":
        from radixserve.entrypoints.engine import Engine

        return Engine
    raise AttributeError(f"module 'radixserve' has no attribute {name!r}")


__all__ = ["Engine", "__version__"]
