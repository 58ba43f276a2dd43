"""Value types of command-line options: a display name plus a parser from the command-line string.

Each parser raises ``argparse.ArgumentTypeError`` (or ValueError) with a message that argparse
turns into one line naming the option.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from typing import Any, NamedTuple


class ValueType(NamedTuple):
    """How an option's value is parsed: ``name`` is shown in help and docs."""

    name: str
    parse: Callable[[str], Any]


# Same suffixes as SGLang: SI (k, M, G, T; decimals allowed) and IEC (Ki, Mi, Gi, Ti).
_MULTIPLIERS = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_MULTIPLIERS.update({"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40})
_HUMAN_INT = re.compile(r"(-?\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?")


def human_readable_int(text: str) -> int:
    """Parse ``4096``, ``32k``, ``1.5M`` or ``128Ki`` into an int (SGLang's suffixes)."""
    match = _HUMAN_INT.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"invalid integer {text!r} (examples: 4096, 32k, 1M, 128Ki)"
        )
    number, suffix = match.groups()
    if suffix is None:
        if "." in number:
            raise argparse.ArgumentTypeError(f"invalid integer {text!r}")
        return int(number)
    if "." in number and suffix.endswith("i"):
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}: no decimals with {suffix}")
    return int(float(number) * _MULTIPLIERS[suffix])


def json_value(text: str) -> Any:
    """Parse a JSON document given on the command line."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON {text!r}: {exc.msg}") from None


def json_object(text: str) -> dict[str, Any]:
    """Parse a JSON object (``{...}``)."""
    value = json_value(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def json_list(text: str) -> list[Any]:
    """Parse a JSON array (``[...]``)."""
    value = json_value(text)
    if not isinstance(value, list):
        raise argparse.ArgumentTypeError(f"expected a JSON array, got {text!r}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None


STR = ValueType("str", str)
INT = ValueType("int", _int)
FLOAT = ValueType("float", _float)
TOKENS = ValueType("int (k/M suffix)", human_readable_int)
JSON = ValueType("JSON", json_value)
JSON_OBJECT = ValueType("JSON object", json_object)
JSON_LIST = ValueType("JSON array", json_list)
