"""The API process's view of the served adapters: name -> id, where runtime loads may read
adapters from, and the name a request asks for.

Ids are never reused: an adapter unloaded and loaded again under the same name gets a new id,
hence a new prefix-cache namespace (its weights may differ).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

from radixserve.lora.config import LoRAConfig, LoRAError, check_adapter_name

# Folders (os.pathsep-separated) that /load_lora_adapter may read adapters from, besides the
# folders holding the --lora-paths adapters.
ALLOWED_DIRS_ENV = "RADIXSERVE_LORA_DIRS"


@dataclass(frozen=True)
class LoRARef:
    lora_id: int
    name: str
    path: str
    pinned: bool = False


class LoRARegistry:
    def __init__(self, config: LoRAConfig | None) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._by_name: dict[str, LoRARef] = {}
        self._pending: set[str] = set()  # names being loaded or unloaded
        specs = config.adapters if config is not None else ()
        for i, spec in enumerate(specs, start=1):  # the ids manager.initial_adapter_ids gives
            self._by_name[spec.name] = LoRARef(i, spec.name, spec.path, spec.pinned)
        self._next_id = len(specs) + 1
        dirs = [Path(spec.path).expanduser().resolve().parent for spec in specs]
        dirs += [Path(d).expanduser().resolve() for d in _env_dirs()]
        self.allowed_dirs = tuple(dict.fromkeys(dirs))

    @property
    def enabled(self) -> bool:
        return self.config is not None

    def refs(self) -> list[LoRARef]:
        with self._lock:
            return sorted(self._by_name.values(), key=lambda r: r.lora_id)

    def resolve(self, name: str | None, param: str = "lora_path") -> int:
        """The adapter id of a request's adapter name (0 for None: the base model)."""
        if name is None:
            return 0
        if not isinstance(name, str):
            raise LoRAError(f"{param} must be an adapter name (a string).", param)
        if not self.enabled:
            raise LoRAError(
                f"This server serves no LoRA adapters (start it with --enable-lora); got "
                f"{param}={name!r}.",
                param,
            )
        with self._lock:
            ref = self._by_name.get(name)
        if ref is None:
            loaded = ", ".join(sorted(self._by_name)) or "none"
            raise LoRAError(f"LoRA adapter {name!r} is not loaded (loaded: {loaded}).", param)
        return ref.lora_id

    def check_path(self, path: object) -> str:
        """A runtime-loaded adapter's folder, resolved (symlinks too), if it lies inside one of
        the allowed folders; the refusal does not echo the path."""
        if not isinstance(path, str) or not path:
            raise LoRAError("lora_path must be a non-empty string.", "lora_path")
        if "\x00" in path:
            raise LoRAError("lora_path is not a valid path.", "lora_path")
        resolved = Path(path).expanduser().resolve()
        for folder in self.allowed_dirs:
            if resolved == folder or folder in resolved.parents:
                return str(resolved)
        raise LoRAError(
            "lora_path is outside the folders this server loads LoRA adapters from (the "
            f"folders of the --lora-paths adapters and those listed in {ALLOWED_DIRS_ENV}).",
            "lora_path",
        )

    def begin_load(self, name: str, pinned: bool) -> int:
        """Reserve a new id for `name`; the caller commits or cancels."""
        check_adapter_name(name)
        with self._lock:
            if name in self._by_name or name in self._pending:
                raise LoRAError(f"A LoRA adapter named {name!r} is already loaded.", "lora_name")
            self._pending.add(name)
            lora_id = self._next_id
            self._next_id += 1
            return lora_id

    def end_load(self, ref: LoRARef | None, name: str) -> None:
        with self._lock:
            self._pending.discard(name)
            if ref is not None:
                self._by_name[name] = ref

    def begin_unload(self, name: object) -> LoRARef:
        """Hide `name` from new requests; the caller finishes or restores it."""
        if not isinstance(name, str):
            raise LoRAError("lora_name must be a string.", "lora_name")
        with self._lock:
            ref = self._by_name.pop(name, None)
            if ref is None:
                raise LoRAError(f"LoRA adapter {name!r} is not loaded.", "lora_name")
            self._pending.add(name)
            return ref

    def end_unload(self, ref: LoRARef, unloaded: bool) -> None:
        with self._lock:
            self._pending.discard(ref.name)
            if not unloaded:
                self._by_name[ref.name] = ref


def _env_dirs() -> list[str]:
    value = os.environ.get(ALLOWED_DIRS_ENV, "")
    return [d for d in value.split(os.pathsep) if d.strip()]
