"""The vision encoder's output kept by image content hash (--mm-preprocess-cache-size-mb): an
image seen again (a new question about the same screenshot, after its prefix left the radix
cache or in a request whose text before it differs) skips the vision tower. Least recently
used first out, within a byte budget; a budget of 0 keeps nothing."""

from __future__ import annotations

from collections import OrderedDict

import torch

MIB = 1 << 20
# Without the option: enough for ~50 LLaVA-1.5-7B images (576 x 4096 float32, 9 MiB each).
DEFAULT_BUDGET_MIB = 512


class VisionFeatureCache:
    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = max(0, budget_bytes)
        self.used_bytes = 0
        self.hits = self.misses = 0
        self._entries: OrderedDict[int, torch.Tensor] = OrderedDict()

    def get(self, key: int) -> torch.Tensor | None:
        features = self._entries.get(key)
        if features is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return features

    def put(self, key: int, features: torch.Tensor) -> None:
        size = features.numel() * features.element_size()
        if size > self.budget_bytes or key in self._entries:
            return
        while self.used_bytes + size > self.budget_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.used_bytes -= evicted.numel() * evicted.element_size()
        # A copy of its own: the step's stacked output would keep every image of it alive.
        self._entries[key] = features.detach().clone()
        self.used_bytes += size

    def __len__(self) -> int:
        return len(self._entries)


def budget_bytes(size_mb: int | None) -> int:
    """The option's MiB (None: DEFAULT_BUDGET_MIB) in bytes."""
    return (DEFAULT_BUDGET_MIB if size_mb is None else size_mb) * MIB
