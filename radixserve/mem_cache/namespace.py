"""Keeping prefix-cache entries of different namespaces (LoRA adapters) apart.

The KV of a prompt computed under one adapter is wrong for another adapter or for the base
model, so cached prefixes must never be shared across them. Rather than a second key element
in the radix tree, each token id of a non-zero namespace is moved into a range of its own:
token + namespace * 2**32. Token ids are below 2**32, so two namespaces never produce an equal
key and therefore never share a tree node, while the base model (namespace 0) keeps its plain
token ids (no cost when LoRA is off).
"""

from __future__ import annotations

from collections.abc import Sequence

NAMESPACE_STRIDE = 1 << 32


def namespaced_key(tokens: Sequence[int], namespace: int) -> Sequence[int]:
    if namespace == 0:
        return tokens
    if namespace < 0:
        raise ValueError(f"namespace must be >= 0, got {namespace}")
    offset = namespace * NAMESPACE_STRIDE
    return [t + offset for t in tokens]
