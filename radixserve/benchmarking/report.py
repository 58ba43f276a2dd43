"""Text for the benchmark tools' result tables (SGLang's layout) and their JSONL output."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

WIDTH = 50
Row = tuple[str, Any] | str  # (label, value), or a section title


def _value(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def format_table(title: str, rows: Sequence[Row]) -> str:
    """A titled block of `label value` lines; a plain string row starts a section."""
    lines = ["", f" {title} ".center(WIDTH, "=")]
    for row in rows:
        if isinstance(row, str):
            lines.append(row.center(WIDTH, "-"))
        else:
            label, value = row
            lines.append(f"{label:<40} {_value(value):<10}")
    lines.append("=" * WIDTH)
    return "\n".join(lines)


def append_jsonl(path: str | Path, record: Mapping[str, Any]) -> None:
    """Append one JSON line (SGLang's tools append, so runs accumulate in one file)."""
    with Path(path).open("a") as f:
        f.write(json.dumps(dict(record), default=str) + "\n")


def percent(share: float | None) -> str:
    return "n/a" if share is None else f"{100 * share:.1f}%"
