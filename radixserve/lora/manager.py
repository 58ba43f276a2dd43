"""The scheduler process's LoRA state: the loaded adapters (host memory), their device slots,
and each step's row segments for the hooked linear layers."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from radixserve.layers.lora import (
    LoRABatchState,
    LoRASegment,
    attach_lora_hooks,
    decoder_sub_projections,
)
from radixserve.lora.config import LoRAConfig, LoRAError
from radixserve.lora.peft_adapter import LoRAAdapter, load_peft_adapter
from radixserve.lora.slots import AdapterSlots

logger = logging.getLogger(__name__)

BASE_MODEL = 0  # the adapter id of requests that use no adapter


def initial_adapter_ids(config: LoRAConfig) -> list[tuple[int, str, str, bool]]:
    """(id, name, path, pinned) of the --lora-paths adapters: ids 1, 2, ... in order. The API process
    derives the same ids from the same options, so no message is needed to agree on them."""
    return [
        (i, spec.name, spec.path, spec.pinned) for i, spec in enumerate(config.adapters, start=1)
    ]


class LoRAManager:
    def __init__(
        self, config: LoRAConfig, model: nn.Module, dtype: torch.dtype, device: torch.device
    ) -> None:
        layers = getattr(getattr(model, "model", None), "layers", None)
        if not isinstance(layers, nn.ModuleList) or not len(layers):
            raise ValueError(
                f"--enable-lora: {type(model).__name__} is not a Llama-family decoder model; "
                "LoRA adapters are served on Llama, Mistral, Qwen2 and Qwen3 models"
            )
        self.config = config
        self.dtype = dtype
        self.device = device
        self.state = LoRABatchState()
        self.projections = [decoder_sub_projections(layer) for layer in layers]
        self.hooks = attach_lora_hooks(layers, self.state)
        self.adapters: dict[int, LoRAAdapter] = {}
        self.slots = AdapterSlots(config.max_loras_per_batch, config.eviction_policy)
        for uid, name, path, pinned in initial_adapter_ids(config):
            self.load(uid, name, path, pinned)

    def load(self, uid: int, name: str, path: str, pinned: bool = False) -> dict[str, Any]:
        if uid in self.adapters or uid == BASE_MODEL:
            raise LoRAError(f"LoRA adapter id {uid} is already in use.", "lora_name")
        limit = self.config.max_loaded_loras
        if limit is not None and len(self.adapters) >= limit:
            raise LoRAError(
                f"Cannot load LoRA adapter {name!r}: {len(self.adapters)} adapters are loaded, "
                f"the server's --max-loaded-loras is {limit}; unload one first.",
                "lora_name",
            )
        # Host memory; a slot copies them to the device when a batch first needs them.
        adapter = load_peft_adapter(
            name, path, self.projections, self.config, self.dtype, torch.device("cpu")
        )
        if pinned:
            try:
                placement = self.slots.pin(uid)
            except ValueError as exc:
                raise LoRAError(f"Cannot pin LoRA adapter {name!r}: {exc}.", "pinned") from None
            self._fill_slot(placement.slot, adapter)
        self.adapters[uid] = adapter
        logger.info(
            "LoRA adapter %r loaded (id %d, rank %d, %s; %.1f MiB)",
            name,
            uid,
            adapter.rank,
            ",".join(adapter.target_modules),
            adapter.nbytes / 2**20,
        )
        return {"rank": adapter.rank, "target_modules": list(adapter.target_modules)}

    def unload(self, uid: int) -> None:
        adapter = self.adapters.pop(uid, None)
        if adapter is None:
            raise LoRAError(f"LoRA adapter id {uid} is not loaded.", "lora_name")
        slot = self.slots.release(uid)
        if slot is not None:
            self._clear_slot(slot)
        logger.info("LoRA adapter %r unloaded", adapter.name)

    def has(self, uid: int) -> bool:
        return uid == BASE_MODEL or uid in self.adapters

    def prepare(self, lora_ids: Sequence[int], extend_lens: Sequence[int]) -> None:
        """Set the segments of the next forward: request i's `extend_lens[i]` flattened rows
        use adapter `lora_ids[i]` (0: the base model)."""
        self.state.segments = []
        if not lora_ids or not any(lora_ids):
            return
        rows: dict[int, list[int]] = {}
        start = 0
        for uid, n in zip(lora_ids, extend_lens, strict=True):
            if uid != BASE_MODEL:
                rows.setdefault(uid, []).extend(range(start, start + n))
            start += n
        batch = set(rows)
        segments = []
        for uid, uid_rows in rows.items():
            adapter = self.adapters.get(uid)
            if adapter is None:
                raise RuntimeError(f"a request uses LoRA adapter id {uid}, which is not loaded")
            placement = self.slots.place(uid, batch)
            if placement.fresh:
                self._fill_slot(placement.slot, adapter)
            index = torch.tensor(uid_rows, dtype=torch.int64, device=self.device)
            segments.append(LoRASegment(placement.slot, index))
        self.state.segments = segments

    def _fill_slot(self, slot: int, adapter: LoRAAdapter) -> None:
        for key, hook in self.hooks.items():
            weights = adapter.weights.get(key)
            if weights is None:
                hook.slot_weights.pop(slot, None)
            else:
                hook.slot_weights[slot] = weights._replace(
                    a=weights.a.to(self.device), b=weights.b.to(self.device)
                )

    def _clear_slot(self, slot: int) -> None:
        for hook in self.hooks.values():
            hook.slot_weights.pop(slot, None)

    def describe(self) -> list[dict[str, Any]]:
        return [
            {"id": uid, "name": a.name, "rank": a.rank, "target_modules": list(a.target_modules)}
            for uid, a in sorted(self.adapters.items())
        ]
