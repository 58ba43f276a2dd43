"""Small host and environment helpers shared across the package."""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)


def env_flag(name: str, default: bool = False) -> bool:
    """A boolean environment variable: 1/true/yes/on are true, 0/false/no/off/"" false."""
    value = os.environ.get(name)
    if value is None:
        return default
    value = value.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"environment variable {name}={value!r} is not a boolean (use 1 or 0)")
