"""Responses kept in memory (`store: true`, the default) for GET/DELETE /v1/responses/{id} and
`previous_response_id`, as SGLang and vLLM keep them. Bounded: past `capacity` the oldest is
dropped, so a long-running server does not grow without limit. Lost on restart."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

DEFAULT_CAPACITY = 1024
CAPACITY_ENV = "RADIXSERVE_RESPONSES_STORE_SIZE"


@dataclass(frozen=True)
class StoredResponse:
    body: dict[str, Any]
    # The conversation up to and including this response, as chat messages (without the
    # instructions, which OpenAI applies to one turn only): the history of a follow-up turn.
    messages: tuple[dict[str, Any], ...]


class ResponseStore:
    def __init__(self, capacity: int | None = None) -> None:
        if capacity is None:
            capacity = int(os.environ.get(CAPACITY_ENV, DEFAULT_CAPACITY))
        self.capacity = max(0, capacity)
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        # Streams finish on the event loop, but the engine's threads never touch this; the lock
        # keeps it correct if a handler ever runs in a worker thread.
        self._lock = threading.Lock()

    def put(self, response_id: str, stored: StoredResponse) -> None:
        if self.capacity == 0:
            return
        with self._lock:
            self._items[response_id] = stored
            self._items.move_to_end(response_id)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            return self._items.get(response_id)

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._items.pop(response_id, None) is not None

    def __len__(self) -> int:
        return len(self._items)
