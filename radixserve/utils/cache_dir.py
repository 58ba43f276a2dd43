"""radixserve's own cache folder: converted GGUF models (gguf/), inductor's compiled graphs
(torch_compile/), the `--dtype auto` verdicts (auto-dtype-*.json) and start-up records
(startup/, utils/startup_cache.py). `radixserve cache` lists and clears it."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "RADIXSERVE_CACHE_DIR"


def radixserve_cache_dir() -> Path:
    """$RADIXSERVE_CACHE_DIR when set, else the user cache folder's `radixserve`."""
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("radixserve"))
