"""Small JSON records that let a later start skip work whose answer depends only on its inputs:
the model config transformers built from a config.json, the tokenizer class AutoTokenizer
chose for a folder, the kernel paths timed for a CPU and model shape. Each record is named by
a hash of everything its answer depends on, so a changed input (a file, a library version)
names another record and the work is done again. They live in <radixserve cache>/startup/
(`radixserve cache clear startup` removes them).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from radixserve.utils.cache_dir import radixserve_cache_dir

logger = logging.getLogger(__name__)

FOLDER = "startup"
# Records kept: past this many, writing one removes the oldest (tests and model folders
# that come and go would otherwise leave records forever).
MAX_RECORDS = 1000


def key_of(parts: Iterable[str | bytes]) -> str:
    """A hash of `parts`, each length-prefixed (so ("ab", "c") and ("a", "bc") differ)."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()[:32]


def package_version(name: str) -> str:
    """An installed package's version from its metadata (importing it could be slow)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "none"


def record_path(kind: str, key: str) -> Path:
    return radixserve_cache_dir() / FOLDER / f"{kind}-{key}.json"


def read_record(kind: str, key: str) -> dict[str, Any] | None:
    """The record, or None when there is none (or it is unreadable: then it is made again)."""
    try:
        data = json.loads(record_path(kind, key).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_record(kind: str, key: str, data: dict[str, Any]) -> None:
    """Write atomically (a reader never sees half a record); an unwritable cache only means
    doing the work again next start."""
    path = record_path(kind, key)
    try:
        text = json.dumps(data)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except (OSError, TypeError, ValueError) as e:
        logger.debug("not writing %s: %s", path, e)
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except OSError as e:
        logger.debug("could not write %s: %s", path, e)
        Path(tmp).unlink(missing_ok=True)
        return
    _prune(path.parent)


def _prune(folder: Path) -> None:
    try:
        records = [(p.stat().st_mtime, p) for p in folder.glob("*.json")]
    except OSError:
        return
    if len(records) <= MAX_RECORDS:
        return
    records.sort()
    for _, old in records[: len(records) - MAX_RECORDS]:
        old.unlink(missing_ok=True)
