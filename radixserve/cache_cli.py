"""`radixserve cache list` and `radixserve cache clear`: the converted-GGUF cache."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

_USAGE = """usage: radixserve cache <list|clear> [name ...]

  list          the converted GGUF folders, their sizes, and the cache location
  clear [name]  remove every converted folder, or only those named (as `list` prints them)

The cache lives under the user cache folder (RADIXSERVE_CACHE_DIR overrides it); a GGUF is
converted again on its next start.
"""


def _folders(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def run(argv: Sequence[str]) -> int:
    from radixserve.models.gguf import cache_root

    root = cache_root()
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE, end="", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    command, names = argv[0], list(argv[1:])
    if command == "list":
        folders = _folders(root)
        print(f"cache: {root}")
        for folder in folders:
            print(f"  {folder.name}  {_size(folder) / 2**20:,.0f} MiB")
        if not folders:
            print("  (empty)")
        return 0
    if command == "clear":
        folders = _folders(root)
        unknown = sorted(set(names) - {f.name for f in folders})
        if unknown:
            print(
                f"radixserve cache: error: not in the cache: {', '.join(unknown)}", file=sys.stderr
            )
            return 2
        chosen = [f for f in folders if not names or f.name in names]
        for folder in chosen:
            shutil.rmtree(folder)
        print(f"removed {len(chosen)} converted folder(s) from {root}")
        return 0
    print(f"radixserve cache: error: unknown command '{command}' (list or clear)", file=sys.stderr)
    return 2
