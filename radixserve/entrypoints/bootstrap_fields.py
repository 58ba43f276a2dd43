"""SGLang's PD fields on a request body: `bootstrap_host`, `bootstrap_port`, `bootstrap_room`,
which SGLang's router adds to both halves of a request (one value each, or one per prompt for a
batch), turned into one `BootstrapInfo` per prompt."""

from __future__ import annotations

from typing import Any

from radixserve.entrypoints.openai.errors import ApiError
from radixserve.messages import BootstrapInfo

FIELDS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")


def _spread(value: Any, count: int, name: str) -> list[Any]:
    if isinstance(value, list):
        if len(value) != count:
            raise ApiError(400, f"{name} has {len(value)} entries for {count} prompts.", param=name)
        return list(value)
    return [value] * count


def bootstrap_per_prompt(host: Any, port: Any, room: Any, count: int) -> list[BootstrapInfo | None]:
    """One BootstrapInfo (or None: a plain request) per prompt; a 400 for a half-set or
    ill-typed triple."""
    if host is None and port is None and room is None:
        return [None] * count
    hosts = _spread(host, count, "bootstrap_host")
    ports = _spread(port, count, "bootstrap_port")
    rooms = _spread(room, count, "bootstrap_room")
    out: list[BootstrapInfo | None] = []
    for h, p, r in zip(hosts, ports, rooms, strict=True):
        if h is None and p is None and r is None:
            out.append(None)
            continue
        if not isinstance(h, str) or not h:
            raise ApiError(400, "bootstrap_host must be a host name.", param="bootstrap_host")
        for value, name in ((p, "bootstrap_port"), (r, "bootstrap_room")):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ApiError(400, f"{name} must be an integer >= 0.", param=name)
        out.append(BootstrapInfo(h, p, r))
    return out
