"""The scheduler's side of multi-LoRA: which adapters a batch may hold, and loading or
unloading adapters between steps (never under a request that uses them)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from radixserve.lora.config import LoRAError

if TYPE_CHECKING:
    from radixserve.lora.manager import LoRAManager
    from radixserve.managers.schedule_batch import Req


class LoRAInUse(LoRAError):
    """An unload refused because live requests still use the adapter; the API side retries
    until they finish."""


class LoRAScheduling:
    def __init__(self, manager: LoRAManager | None, live_reqs: Callable[[], list[Req]]) -> None:
        self.manager = manager
        self.live_reqs = live_reqs

    def has_adapter(self, lora_id: int) -> bool:
        return self.manager is not None and self.manager.has(lora_id)

    def fits_batch(self, req: Req, batch: Iterable[Req]) -> bool:
        """Whether `req` can join requests `batch` (the running ones and the prefill so far)
        within --max-loras-per-batch distinct adapters (the base model takes no slot)."""
        if self.manager is None or not req.lora_id:
            return True
        adapters = {r.lora_id for r in batch if r.lora_id}
        if req.lora_id in adapters:
            return True
        return len(adapters) < self.manager.config.max_loras_per_batch

    def load(self, lora_id: int, name: str, path: str, pinned: bool = False) -> dict[str, Any]:
        if self.manager is None:
            raise LoRAError("LoRA is not enabled on this server (start it with --enable-lora).")
        return self.manager.load(lora_id, name, path, pinned)

    def unload(self, lora_id: int) -> None:
        if self.manager is None:
            raise LoRAError("LoRA is not enabled on this server (start it with --enable-lora).")
        users = sum(1 for r in self.live_reqs() if r.lora_id == lora_id)
        if users:
            raise LoRAInUse(f"LoRA adapter is in use by {users} running or waiting requests.")
        self.manager.unload(lora_id)

    def describe(self) -> list[dict[str, Any]]:
        return [] if self.manager is None else self.manager.describe()
