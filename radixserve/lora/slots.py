"""The device slots adapters occupy while their requests run (--max-loras-per-batch of them).

A batch may use at most that many adapters; an adapter not yet in a slot takes a free one, else
the slot of an adapter the batch does not use, chosen by --lora-eviction-policy: lru (least
recently used in a batch) or fifo (placed earliest). SGLang's GPU LoRA memory pool behaves so.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection
from typing import NamedTuple


class Placement(NamedTuple):
    slot: int
    evicted: int | None  # the adapter id that lost the slot, if any
    fresh: bool  # the adapter was not in a slot before: its weights must be copied in


class AdapterSlots:
    def __init__(self, capacity: int, policy: str) -> None:
        if capacity < 1:
            raise ValueError(f"need at least one LoRA slot, got {capacity}")
        if policy not in ("lru", "fifo"):
            raise ValueError(f"unknown LoRA eviction policy {policy!r}")
        self.capacity = capacity
        self.policy = policy
        self._owner: dict[int, int] = {}  # slot -> adapter id
        self._slot_of: dict[int, int] = {}  # adapter id -> slot
        self._placed_at: dict[int, int] = {}  # adapter id -> tick it entered its slot
        self._used_at: dict[int, int] = {}  # adapter id -> tick of its last batch
        self._clock = itertools.count(1)
        self._pinned: set[int] = set()  # never evicted (a pinned adapter)

    def resident(self) -> list[int]:
        return sorted(self._slot_of)

    def place(self, uid: int, batch: Collection[int]) -> Placement:
        """A slot for adapter `uid`, which a batch of adapters `batch` is about to use."""
        now = next(self._clock)
        slot = self._slot_of.get(uid)
        if slot is not None:
            self._used_at[uid] = now
            return Placement(slot, None, False)
        free = [s for s in range(self.capacity) if s not in self._owner]
        evicted = None
        if free:
            slot = free[0]
        else:
            candidates = [u for u in self._slot_of if u not in batch and u not in self._pinned]
            if not candidates:
                raise RuntimeError(
                    f"a batch uses more than --max-loras-per-batch={self.capacity} adapters"
                )
            order = self._used_at if self.policy == "lru" else self._placed_at
            evicted = min(candidates, key=lambda u: (order[u], u))
            slot = self._slot_of.pop(evicted)
            del self._placed_at[evicted], self._used_at[evicted]
        self._owner[slot] = uid
        self._slot_of[uid] = slot
        self._placed_at[uid] = now
        self._used_at[uid] = now
        return Placement(slot, evicted, True)

    def pin(self, uid: int) -> Placement:
        """Place `uid` for good. One slot always stays unpinned, for the other adapters."""
        if len(self._pinned) + 1 >= self.capacity:
            raise ValueError(
                f"cannot pin another adapter: {len(self._pinned)} of the "
                f"{self.capacity} slots (--max-loras-per-batch) are pinned and one must stay free"
            )
        placement = self.place(uid, ())
        self._pinned.add(uid)
        return placement

    def release(self, uid: int) -> int | None:
        """Free `uid`'s slot (the adapter is unloaded); returns the slot it had."""
        self._pinned.discard(uid)
        slot = self._slot_of.pop(uid, None)
        if slot is not None:
            del self._owner[slot], self._placed_at[uid], self._used_at[uid]
        return slot
