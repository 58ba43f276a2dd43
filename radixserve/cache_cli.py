"""`radixserve cache list` and `radixserve cache clear`: what radixserve keeps on disk."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from radixserve.utils.cache_dir import radixserve_cache_dir

_USAGE = """usage: radixserve cache <list|clear> [name ...]

  list          what the cache holds, with sizes, and where it is
  clear [name]  remove everything, or only the entries named (as `list` prints them)

Entries: converted GGUF folders (a GGUF is converted again on its next start), torch_compile
(the --enable-torch-compile graphs; compiled again on next use), auto-dtype-*.json (the
--dtype auto verdict per CPU; probed again on next start) and startup (model configs,
tokenizer classes and kernel timings remembered from earlier starts; found again next start). The cache lives under the user cache
folder (RADIXSERVE_CACHE_DIR overrides it).
"""


@dataclass(frozen=True)
class Entry:
    name: str
    path: Path
    kind: str

    def size(self) -> int:
        if self.path.is_file():
            return self.path.stat().st_size
        return sum(f.stat().st_size for f in self.path.rglob("*") if f.is_file())

    def remove(self) -> None:
        if self.path.is_dir():
            shutil.rmtree(self.path)
        else:
            self.path.unlink()


def entries() -> list[Entry]:
    # The folders by name, without importing the modules that use them (and torch).
    root = radixserve_cache_dir()
    found: list[Entry] = []
    gguf = root / "gguf"
    if gguf.is_dir():
        found += [
            Entry(p.name, p, "converted GGUF")
            for p in sorted(gguf.iterdir())
            if p.is_dir() and not p.name.startswith(".")
        ]
        found += [
            Entry(p.name, p, "GGUF tensor table") for p in sorted(gguf.glob("*-tensors.json"))
        ]
    # Only radixserve's own folder: a $TORCHINDUCTOR_CACHE_DIR elsewhere is the user's.
    compiled = root / "torch_compile"
    if compiled.is_dir():
        found.append(Entry(compiled.name, compiled, "torch.compile graphs"))
    found += [
        Entry(p.name, p, "--dtype auto verdict") for p in sorted(root.glob("auto-dtype-*.json"))
    ]
    startup = root / "startup"  # utils/startup_cache.py
    if startup.is_dir():
        found.append(Entry(startup.name, startup, "start-up records"))
    return found


def run(argv: Sequence[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE, end="", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    command, names = argv[0], list(argv[1:])
    root = radixserve_cache_dir()
    if command == "list":
        found = entries()
        print(f"cache: {root}")
        for entry in found:
            print(f"  {entry.name}  {entry.size() / 2**20:,.1f} MiB  ({entry.kind})")
        if not found:
            print("  (empty)")
        return 0
    if command == "clear":
        found = entries()
        unknown = sorted(set(names) - {e.name for e in found})
        if unknown:
            print(
                f"radixserve cache: error: not in the cache: {', '.join(unknown)}", file=sys.stderr
            )
            return 2
        chosen = [e for e in found if not names or e.name in names]
        for entry in chosen:
            entry.remove()
        print(f"removed {len(chosen)} entr{'y' if len(chosen) == 1 else 'ies'} from {root}")
        return 0
    print(f"radixserve cache: error: unknown command '{command}' (list or clear)", file=sys.stderr)
    return 2
