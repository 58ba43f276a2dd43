"""The `session_params` field of a generate request (SGLang's SessionParams), checked on the
API side (a 400 before queueing) and again by the scheduler's SessionController."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixserve.errors import InvalidRequestError

SESSION_PARAM_KEYS = frozenset({"id", "rid", "offset", "replace", "drop_previous_output"})


class SessionError(InvalidRequestError):
    """A request's session_params cannot be honoured (answered with a 400)."""


@dataclass(frozen=True)
class SessionParams:
    id: str
    rid: str | None = None
    offset: int | None = None
    replace: bool = False
    drop_previous_output: bool = False

    @classmethod
    def parse(cls, raw: Any) -> SessionParams:
        """Check the wire dict (the API side calls this too, to answer 400 early)."""
        if not isinstance(raw, dict):
            raise SessionError("session_params must be an object.")
        unknown = set(raw) - SESSION_PARAM_KEYS
        if unknown:
            raise SessionError(f"Unknown session_params fields: {', '.join(sorted(unknown))}.")
        sid, rid, offset = raw.get("id"), raw.get("rid"), raw.get("offset")
        if not isinstance(sid, str) or not sid:
            raise SessionError("session_params.id must be a session id string.")
        if rid is not None and not isinstance(rid, str):
            raise SessionError("session_params.rid must be a string.")
        if offset is not None and (isinstance(offset, bool) or not isinstance(offset, int)):
            raise SessionError("session_params.offset must be an integer.")
        flags = {}
        for name in ("replace", "drop_previous_output"):
            value = raw.get(name)
            if value is not None and not isinstance(value, bool):
                raise SessionError(f"session_params.{name} must be a boolean.")
            flags[name] = bool(value)
        return cls(sid, rid, offset, **flags)
