"""Check and convert option values that did not come through argparse (Python kwargs).

The command line already yields typed values; ``Engine(..., **kwargs)`` and direct ServerArgs
construction do not, so every value goes through here: strings are parsed the way the command
line would parse them, lists become tuples (ServerArgs is frozen), and choices are enforced.
"""

from __future__ import annotations

import argparse
from typing import Any

from radixserve.options.errors import ServerArgsError
from radixserve.options.registry import spec_for_dest
from radixserve.options.spec import Kind, OptionSpec
from radixserve.options.value_types import FLOAT, INT, JSON_LIST, JSON_OBJECT, STR, TOKENS


def _bad(spec: OptionSpec, message: str) -> ServerArgsError:
    return ServerArgsError(spec.name, message)


def _typed(spec: OptionSpec, value: Any) -> Any:
    vtype = spec.vtype
    assert vtype is not None
    if isinstance(value, str) and vtype is not STR:
        try:
            return vtype.parse(value)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise _bad(spec, str(exc)) from None
    if vtype in (INT, TOKENS):
        if isinstance(value, bool) or not isinstance(value, int):
            raise _bad(spec, f"expected an integer, got {value!r}")
    elif vtype is FLOAT:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _bad(spec, f"expected a number, got {value!r}")
        value = float(value)
    elif vtype is STR:
        if not isinstance(value, str):
            raise _bad(spec, f"expected a string, got {value!r}")
    elif vtype is JSON_OBJECT and not isinstance(value, dict):
        raise _bad(spec, f"expected a JSON object (dict), got {value!r}")
    elif vtype is JSON_LIST and not isinstance(value, (list, tuple)):
        raise _bad(spec, f"expected a JSON array (list), got {value!r}")
    return value


def _one(spec: OptionSpec, value: Any) -> Any:
    value = _typed(spec, value)
    if spec.choices is not None and value not in spec.choices:
        valid = ", ".join(map(str, spec.choices))
        raise _bad(spec, f"invalid choice {value!r} (choose from {valid})")
    return value


def coerce_value(dest: str, value: Any) -> Any:
    """``value`` checked and normalised for ``dest``; None means "unset" and passes through."""
    spec = spec_for_dest(dest)
    if value is None:
        return None
    if spec.kind in (Kind.FLAG, Kind.BOOL_OPT, Kind.DEPRECATED_CONST):
        if not isinstance(value, bool):
            raise _bad(spec, f"expected True or False, got {value!r}")
        return value
    if spec.nargs in ("+", "*"):
        items = value if isinstance(value, (list, tuple)) else [value]
        return tuple(_one(spec, item) for item in items)
    return _one(spec, value)
