"""JSON schema to regex for the outlines backend: outlines-core's translation, plus the two
things it lacks.

- Integer bounds: outlines-core ignores ``minimum`` / ``maximum`` (and the exclusive forms) on
  integers. Each bounded integer is swapped for a placeholder ``const`` before translation, and
  the placeholder's literal in the regex is then replaced by a regex for exactly that range.
- Any JSON: outlines-core's regex for an unconstrained object nests three levels deep and takes
  seconds to turn into an automaton over a 50k vocabulary; ``any_json_regex`` nests two levels
  and compiles about 20x faster.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

from outlines_core import json_schema as oc_json

# Keys whose values are data, not subschemas, so they are never rewritten.
_DATA_KEYS = frozenset({"enum", "const", "default", "examples"})
_BOUND_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_PLACEHOLDER_STEM = "RSVBOUNDEDINT"
_PLACEHOLDER = _PLACEHOLDER_STEM + "{}X"


class EmptyRangeError(ValueError):
    """An integer schema whose bounds admit no integer."""


def schema_to_regex(schema_text: str, whitespace: str | None) -> str:
    """outlines-core's regex for ``schema_text``, with integer bounds enforced."""
    schema = json.loads(schema_text)
    ranges: list[tuple[int | None, int | None]] = []
    if isinstance(schema, dict) and _PLACEHOLDER_STEM not in schema_text:
        schema = _swap_bounded_integers(copy.deepcopy(schema), ranges)
    regex = oc_json.build_regex_from_schema(json.dumps(schema), whitespace)
    for i, (lo, hi) in enumerate(ranges):
        regex = regex.replace(f'"{_PLACEHOLDER.format(i)}"', f"({integer_range_regex(lo, hi)})")
    return regex


def _swap_bounded_integers(node: Any, ranges: list[tuple[int | None, int | None]]) -> Any:
    if isinstance(node, list):
        return [_swap_bounded_integers(item, ranges) for item in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "integer" and "enum" not in node and "const" not in node:
        bounds = _integer_bounds(node)
        if bounds != (None, None):
            ranges.append(bounds)
            return {"const": _PLACEHOLDER.format(len(ranges) - 1)}
    return {
        key: value if key in _DATA_KEYS else _swap_bounded_integers(value, ranges)
        for key, value in node.items()
    }


def _integer_bounds(node: dict[str, Any]) -> tuple[int | None, int | None]:
    lo: int | None = None
    hi: int | None = None
    minimum, maximum = node.get("minimum"), node.get("maximum")
    ex_min, ex_max = node.get("exclusiveMinimum"), node.get("exclusiveMaximum")
    if _is_number(minimum):
        # Draft 4 spelled exclusiveness as a boolean next to minimum / maximum.
        lo = math.floor(minimum) + 1 if ex_min is True else math.ceil(minimum)
    if _is_number(ex_min):
        lo = max(lo, math.floor(ex_min) + 1) if lo is not None else math.floor(ex_min) + 1
    if _is_number(maximum):
        hi = math.ceil(maximum) - 1 if ex_max is True else math.floor(maximum)
    if _is_number(ex_max):
        hi = min(hi, math.ceil(ex_max) - 1) if hi is not None else math.ceil(ex_max) - 1
    if lo is not None and hi is not None and lo > hi:
        raise EmptyRangeError(f"no integer lies within the bounds of {json.dumps(node)}")
    return lo, hi


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def integer_range_regex(lo: int | None, hi: int | None) -> str:
    """A regex matching exactly the JSON integers in [lo, hi] (None: unbounded)."""
    parts = []
    if lo is None or lo < 0:
        mag_lo = 1 if hi is None or hi >= 0 else -hi
        mag_hi = None if lo is None else -lo
        parts.append(f"-({_natural_range(mag_lo, mag_hi)})")
    if hi is None or hi >= 0:
        parts.append(_natural_range(max(lo or 0, 0), hi))
    return "|".join(parts)


def _natural_range(lo: int, hi: int | None) -> str:
    """Non-negative integers in [lo, hi] without leading zeros (hi None: unbounded)."""
    if hi is None:
        width = len(str(lo))
        # Every number with more digits than lo is above it.
        longer = f"[1-9][0-9]{{{width},}}"
        return f"{_natural_range(lo, 10**width - 1)}|{longer}"
    parts = []
    for width in range(len(str(lo)), len(str(hi)) + 1):
        low = max(lo, 10 ** (width - 1) if width > 1 else 0)
        high = min(hi, 10**width - 1)
        if low <= high:
            parts.append(_same_width(str(low), str(high)))
    return "|".join(parts)


def _same_width(lo: str, hi: str) -> str:
    """Digit strings of one width from lo to hi (inclusive)."""
    if lo == hi:
        return lo
    if len(lo) == 1:
        return f"[{lo}-{hi}]"
    if lo[0] == hi[0]:
        return lo[0] + f"({_same_width(lo[1:], hi[1:])})"
    rest = len(lo) - 1
    parts = []
    first = int(lo[0])
    if lo[1:] != "0" * rest:
        parts.append(lo[0] + f"({_same_width(lo[1:], '9' * rest)})")
        first += 1
    last = int(hi[0])
    tail = None
    if hi[1:] != "9" * rest:
        tail = hi[0] + f"({_same_width('0' * rest, hi[1:])})"
        last -= 1
    if first <= last:
        parts.append(f"[{first}-{last}][0-9]{{{rest}}}")
    if tail:
        parts.append(tail)
    return "|".join(parts)


def any_json_regex(whitespace: str | None, *, object_only: bool) -> str:
    """Any JSON object (``object_only``) or value, with containers nested two levels deep."""
    ws = oc_json.WHITESPACE if whitespace is None else whitespace
    string = oc_json.STRING
    scalar = f"({string}|{oc_json.NUMBER}|{oc_json.BOOLEAN}|{oc_json.NULL})"

    def obj(value: str) -> str:
        member = f"{string}{ws}:{ws}{value}"
        return rf"\{{{ws}({member}({ws},{ws}{member})*)?{ws}\}}"

    def arr(value: str) -> str:
        return rf"\[{ws}({value}({ws},{ws}{value})*)?{ws}\]"

    inner = f"({scalar}|{obj(scalar)}|{arr(scalar)})"
    if object_only:
        return obj(inner)
    return f"({inner}|{obj(inner)}|{arr(inner)})"
