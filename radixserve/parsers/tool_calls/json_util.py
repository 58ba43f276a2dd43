"""Incremental JSON decoding for tool-call formats: only complete values count."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

_DECODER = json.JSONDecoder()


class ArrayScan(NamedTuple):
    items: list[Any]  # complete elements, in order
    end: int | None  # index just past the closing `]`, or None while the array is open
    ok: bool  # False when the text cannot be a JSON array (malformed)


def skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def decode_at(text: str, pos: int) -> tuple[Any, int] | None:
    """The JSON value starting at `pos` and the index after it, or None if not complete."""
    try:
        return _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError:
        return None


def scan_array(text: str, pos: int) -> ArrayScan:
    """Decode the elements of the JSON array whose `[` is at `pos`, as far as they are complete."""
    items: list[Any] = []
    if pos >= len(text) or text[pos] != "[":
        return ArrayScan(items, None, False)
    pos = skip_ws(text, pos + 1)
    if pos < len(text) and text[pos] == "]":
        return ArrayScan(items, pos + 1, True)
    while pos < len(text):
        decoded = decode_at(text, pos)
        if decoded is None:
            return ArrayScan(items, None, True)
        items.append(decoded[0])
        pos = skip_ws(text, decoded[1])
        if pos >= len(text):
            break
        if text[pos] == "]":
            return ArrayScan(items, pos + 1, True)
        if text[pos] != ",":
            return ArrayScan(items, None, False)
        pos = skip_ws(text, pos + 1)
    return ArrayScan(items, None, True)
