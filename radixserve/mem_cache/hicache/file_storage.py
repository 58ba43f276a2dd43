"""The disk tier (`--hicache-storage-backend file`): one file per KV block, named by its chained
block hash, so a restarted server finds the KV of prompts it has seen.

File format: MAGIC, a 4-byte little-endian header length, a JSON header (model identity,
layout, dtype, shape, token count, the block's tokens, a CRC32 of the payload), the payload
(the block's raw bytes). A file whose header or payload does not check out is logged, deleted
and treated as a miss: bad KV is never served.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

MAGIC = b"RSKVBLK1"
VERSION = 1
LAYOUT = "page_first:[layer,kv,token,head,dim]"
SUFFIX = ".kvblock"


class FileStorage:
    """Blocks of shape `block_shape` and `dtype` for the model named by `identity`."""

    def __init__(
        self, root: str | Path, identity: str, block_shape: tuple[int, ...], dtype: torch.dtype
    ) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.identity = identity
        self.block_shape = tuple(block_shape)
        self.dtype = dtype
        self.corrupt_files = 0
        self.write_errors = 0
        self.writes = 0

    def path(self, key: str) -> Path:
        return self.root / f"{key}{SUFFIX}"

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def write(self, key: str, tokens: list[int], block: torch.Tensor) -> bool:
        """Store one block (atomically: a reader sees the old state or the whole new file)."""
        if tuple(block.shape) != self.block_shape or block.dtype != self.dtype:
            raise ValueError(f"block {tuple(block.shape)} {block.dtype} does not fit this store")
        payload = block.contiguous().view(torch.uint8).numpy().tobytes()
        header = json.dumps(
            {
                "version": VERSION,
                "model": self.identity,
                "layout": LAYOUT,
                "dtype": str(self.dtype).removeprefix("torch."),
                "shape": list(self.block_shape),
                "num_tokens": len(tokens),
                "tokens": list(tokens),
                "crc32": zlib.crc32(payload),
                "payload_bytes": len(payload),
            }
        ).encode("utf-8")
        final = self.path(key)
        tmp = final.with_suffix(f".tmp{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                f.write(MAGIC + struct.pack("<I", len(header)) + header + payload)
            os.replace(tmp, final)
        except OSError as exc:
            self.write_errors += 1
            logger.warning("hicache storage: cannot write %s: %s", final, exc)
            tmp.unlink(missing_ok=True)
            return False
        self.writes += 1
        return True

    def read(self, key: str, tokens: list[int]) -> torch.Tensor | None:
        """The block stored under `key` for exactly these tokens, or None (missing or bad)."""
        path = self.path(key)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            logger.warning("hicache storage: cannot read %s: %s", path, exc)
            return None
        problem, block = self._decode(raw, tokens)
        if problem is not None:
            self.corrupt_files += 1
            logger.warning("hicache storage: ignoring %s (%s); deleted", path, problem)
            path.unlink(missing_ok=True)
            return None
        return block

    def _decode(self, raw: bytes, tokens: list[int]) -> tuple[str | None, torch.Tensor | None]:
        head = len(MAGIC) + 4
        if len(raw) < head or raw[: len(MAGIC)] != MAGIC:
            return "bad magic or truncated header", None
        (header_len,) = struct.unpack("<I", raw[len(MAGIC) : head])
        try:
            header: dict[str, Any] = json.loads(raw[head : head + header_len])
        except (ValueError, UnicodeDecodeError):
            return "unreadable header", None
        expected = {
            "version": VERSION,
            "model": self.identity,
            "layout": LAYOUT,
            "dtype": str(self.dtype).removeprefix("torch."),
            "shape": list(self.block_shape),
            "num_tokens": len(tokens),
            "tokens": list(tokens),
        }
        for name, want in expected.items():
            if header.get(name) != want:
                return f"header field {name!r} does not match", None
        payload = raw[head + header_len :]
        if len(payload) != header.get("payload_bytes"):
            size = header.get("payload_bytes")
            return f"payload has {len(payload)} bytes, header says {size}", None
        if zlib.crc32(payload) != header.get("crc32"):
            return "payload checksum mismatch", None
        flat = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        return None, flat.view(self.dtype).view(self.block_shape)
