"""start_engine: the serving Engine for `radixserve serve`, or SystemExit(1) with the reason
logged. Apart from the HTTP modules, so the engine can start before they are imported
(entrypoints/launch.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from radixserve.entrypoints.http_config import HttpConfig

logger = logging.getLogger(__name__)


def start_engine(server_args: Any, on_spawned: Callable[[], None] | None = None) -> Any:
    """The Engine for `server_args`; SystemExit(1), its reason logged, when it fails.
    `on_spawned` runs once its processes are started (Engine's argument)."""
    config = HttpConfig.from_server_args(server_args)  # bad HTTP options fail before any spawn
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=config.log_level.upper(),
            format="[%(asctime)s] %(levelname)s %(name)s: %(message)s",
        )
    from radixserve.managers.multiprocess_runtime import EngineStartupError

    try:
        from radixserve.entrypoints.engine import Engine

        return Engine(server_args, on_spawned=on_spawned)
    except EngineStartupError as exc:  # the scheduler already logged why: no traceback here
        logger.error("%s", exc)
        raise SystemExit(1) from None
    except Exception:
        logger.exception("The engine failed to start")
        raise SystemExit(1) from None
