"""GGUF files' cache keys and tensor tables, without torch (option resolution reads them before
any process imports it).

- `cached_folder`: where a GGUF's converted config and tokenizer live, named after a hash of the
  file's size, head and tail (models/gguf.py fills it).
- `tensor_table`: the file's tensor table (names, block types, shapes, offsets), parsed once by
  gguf-py's GGUFReader, which builds numpy views of every metadata field (~2 s for a 49k-token
  vocabulary), then kept as `<cached folder name>-tensors.json` beside that folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import NamedTuple

from radixserve.utils.cache_dir import radixserve_cache_dir

logger = logging.getLogger(__name__)

# Bump when the converted layout changes, so stale caches are not reused.
CONVERTER_VERSION = 1


class TensorEntry(NamedTuple):
    """One row of a GGUF file's tensor table: what loading needs of it."""

    name: str
    tensor_type: int
    shape: tuple[int, ...]  # GGUF order: fastest-varying dimension first
    n_bytes: int
    data_offset: int  # from the start of the file
    rows: int  # quantized: rows of blocks; float: leading dimension of the stored array


def cache_root() -> Path:
    return radixserve_cache_dir() / "gguf"


_HEAD_BYTES = 4 * 2**20  # the header (metadata, tensor table) and the first tensors
_TAIL_BYTES = 2**20


def content_fingerprint(path: Path) -> str:
    """A hash of the file's size, head and tail (the header names every tensor and its offset,
    so two different files of one size differ there): cheap even for multi-GB files."""
    size = path.stat().st_size
    digest = hashlib.sha256(f"{size}|{CONVERTER_VERSION}|".encode())
    with path.open("rb") as f:
        digest.update(f.read(_HEAD_BYTES))
        if size > _HEAD_BYTES:
            f.seek(max(size - _TAIL_BYTES, _HEAD_BYTES))
            digest.update(f.read(_TAIL_BYTES))
    return digest.hexdigest()[:16]


def cached_folder(gguf_path: Path) -> Path:
    """Where the conversion of `gguf_path` lives (whether or not it exists yet)."""
    path = gguf_path.resolve()
    size = path.stat().st_size
    return cache_root() / f"{path.stem}-{size}-{content_fingerprint(path)}"


def table_cache_path(gguf_path: Path) -> Path:
    """Where `gguf_path`'s tensor table is kept between starts."""
    folder = cached_folder(gguf_path)
    return folder.with_name(f"{folder.name}-tensors.json")


def tensor_table(gguf_path: Path) -> list[TensorEntry]:
    """The file's tensor table: from the cache beside its converted folder, or parsed (and
    cached for the next start)."""
    cache = table_cache_path(gguf_path)
    entries = _read_table_cache(cache, gguf_path)
    if entries is None:
        entries = _read_table(gguf_path)
        _write_table_cache(cache, gguf_path, entries)
    return entries


def _read_table(path: Path) -> list[TensorEntry]:
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except Exception as e:  # the reader raises assorted errors on truncated or foreign files
        raise ValueError(f"corrupt or unreadable GGUF file {path}: {e}") from e
    return [
        TensorEntry(
            name=t.name,
            tensor_type=int(t.tensor_type),
            shape=tuple(int(d) for d in t.shape),
            n_bytes=int(t.n_bytes),
            data_offset=int(t.data_offset),
            rows=int(t.data.shape[0]),  # a view: shape only
        )
        for t in reader.tensors
    ]


_TABLE_VERSION = 1


def _read_table_cache(cache: Path, path: Path) -> list[TensorEntry] | None:
    """The cached table, or None when absent, unreadable or for a file of another size."""
    try:
        data = json.loads(cache.read_text())
        if data.get("version") != _TABLE_VERSION or data.get("file_size") != path.stat().st_size:
            return None
        return [
            TensorEntry(*(tuple(v) if isinstance(v, list) else v for v in row))
            for row in data["tensors"]
        ]
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _write_table_cache(cache: Path, path: Path, entries: list[TensorEntry]) -> None:
    """Best effort (a read-only cache folder only costs the next start the parse): written to a
    temp file and renamed, so a concurrent reader never sees half of it."""
    data = {"version": _TABLE_VERSION, "file_size": path.stat().st_size, "tensors": entries}
    tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data))
        os.replace(tmp, cache)
    except OSError as e:
        logger.debug("could not cache the GGUF tensor table at %s: %s", cache, e)
        tmp.unlink(missing_ok=True)
