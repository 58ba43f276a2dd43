"""Chained hashes of token blocks: block i's key covers every token before it too.

Two prefixes share block i's key exactly when their first (i + 1) * block tokens agree (and the
model identity seeding the chain agrees), so a key names one KV block unambiguously across
processes and restarts, as SGLang's page hashes do.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np


def identity_seed(identity: str) -> bytes:
    """The chain's starting value: KV of different models never shares keys."""
    return hashlib.sha256(identity.encode("utf-8")).digest()


def block_hashes(seed: bytes, tokens: Sequence[int], block: int, count: int) -> list[str]:
    """Hex keys of the first `count` full blocks of `tokens`."""
    count = min(count, len(tokens) // block)
    if count <= 0:
        return []
    arr = np.asarray(tokens[: count * block], dtype=np.int64)
    out: list[str] = []
    prev = seed
    for i in range(count):
        h = hashlib.sha256(prev)
        h.update(arr[i * block : (i + 1) * block].tobytes())
        prev = h.digest()
        out.append(prev.hex())
    return out
