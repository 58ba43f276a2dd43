"""The LoRA options, parsed once into frozen values both processes share."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from radixserve.errors import InvalidRequestError

# The checkpoint projections an adapter may target on the Llama-family models.
SUPPORTED_TARGET_MODULES = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)


class LoRAError(InvalidRequestError):
    """An adapter that cannot be served (missing, malformed, or not fitting the server's
    limits); the HTTP layer answers it with a 400."""


@dataclass(frozen=True)
class AdapterSpec:
    """One adapter to serve: its name (what requests ask for) and its folder."""

    name: str
    path: str
    pinned: bool = False


@dataclass(frozen=True)
class LoRAConfig:
    """--enable-lora and friends, resolved."""

    adapters: tuple[AdapterSpec, ...]
    max_lora_rank: int | None  # None: no limit
    target_modules: tuple[str, ...]  # the projections adapters may target
    max_loras_per_batch: int
    max_loaded_loras: int | None
    eviction_policy: str  # "lru" or "fifo": which device slot a new adapter takes


def check_adapter_name(name: str, param: str = "lora_name") -> str:
    """Names appear in `model: "base:adapter"`: no colon, no blank, nothing odd."""
    if not isinstance(name, str) or not name or name != name.strip() or ":" in name:
        raise LoRAError(
            f"Invalid LoRA adapter name {name!r}: use a non-empty name without ':' or "
            "surrounding spaces.",
            param,
        )
    return name


def parse_lora_paths(values: Iterable[Any] | Mapping[str, str] | None) -> tuple[AdapterSpec, ...]:
    """SGLang's forms of --lora-paths: PATH (named by its path), NAME=PATH, or a JSON object
    {"lora_name", "lora_path", "pinned"}; a mapping name -> path is accepted from config files."""
    if values is None:
        return ()
    if isinstance(values, Mapping):
        values = [f"{k}={v}" for k, v in values.items()]
    if isinstance(values, str):
        values = [values]
    specs: list[AdapterSpec] = []
    for item in values:
        if isinstance(item, Mapping):
            specs.append(_spec_from_json(dict(item)))
            continue
        text = str(item).strip()
        if text.startswith("{"):
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"--lora-paths: invalid JSON {text!r}: {exc}") from None
            specs.append(_spec_from_json(obj))
        elif "=" in text:
            name, path = text.split("=", 1)
            specs.append(AdapterSpec(name.strip(), path.strip()))
        else:
            specs.append(AdapterSpec(text, text))
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"--lora-paths: adapter names given twice: {', '.join(dupes)}")
    for spec in specs:
        try:
            check_adapter_name(spec.name)
        except LoRAError as exc:
            raise ValueError(f"--lora-paths: {exc}") from None
        if not spec.path:
            raise ValueError(f"--lora-paths: adapter {spec.name!r} has an empty path")
    return tuple(specs)


def _spec_from_json(obj: object) -> AdapterSpec:
    if not isinstance(obj, dict) or "lora_name" not in obj or "lora_path" not in obj:
        raise ValueError(
            '--lora-paths: a JSON entry needs "lora_name" and "lora_path" (and optionally '
            f'"pinned"), got {obj!r}'
        )
    extra = set(obj) - {"lora_name", "lora_path", "pinned"}
    if extra:
        raise ValueError(f"--lora-paths: unknown keys {sorted(extra)} in {obj!r}")
    pinned = obj.get("pinned", False)
    if not isinstance(pinned, bool):
        raise ValueError(f"--lora-paths: 'pinned' must be true or false, got {pinned!r}")
    return AdapterSpec(str(obj["lora_name"]), str(obj["lora_path"]), pinned)


# The ServerArgs fields of the LoRA options this module reads.
LORA_FIELDS = (
    "enable_lora",
    "max_lora_rank",
    "lora_target_modules",
    "lora_paths",
    "max_loaded_loras",
    "max_loras_per_batch",
    "lora_eviction_policy",
)


def lora_config_from_args(server_args: Any) -> LoRAConfig | None:
    """The LoRAConfig of a ServerArgs (None when LoRA is off)."""
    return lora_config_from_options({name: getattr(server_args, name) for name in LORA_FIELDS})


def lora_config_from_options(other: Mapping[str, Any]) -> LoRAConfig | None:
    """The LoRAConfig of options by dest (None when LoRA is off). --lora-paths implies
    --enable-lora, as in SGLang."""
    adapters = parse_lora_paths(other.get("lora_paths"))
    if not other.get("enable_lora") and not adapters:
        return None
    per_batch = int(other.get("max_loras_per_batch") or 8)
    if per_batch < 1:
        raise ValueError(f"--max-loras-per-batch must be at least 1, got {per_batch}")
    max_loaded = other.get("max_loaded_loras")
    if max_loaded is not None:
        max_loaded = int(max_loaded)
        if max_loaded < per_batch:
            raise ValueError(
                f"--max-loaded-loras ({max_loaded}) must be at least --max-loras-per-batch "
                f"({per_batch})"
            )
        if len(adapters) > max_loaded:
            raise ValueError(
                f"--lora-paths names {len(adapters)} adapters but --max-loaded-loras is "
                f"{max_loaded}"
            )
    rank = other.get("max_lora_rank")
    if rank is not None and int(rank) < 1:
        raise ValueError(f"--max-lora-rank must be at least 1, got {rank}")
    policy = str(other.get("lora_eviction_policy") or "lru")
    if policy not in ("lru", "fifo"):
        raise ValueError(f"--lora-eviction-policy must be lru or fifo, got {policy!r}")
    return LoRAConfig(
        adapters=adapters,
        max_lora_rank=None if rank is None else int(rank),
        target_modules=_target_modules(other.get("lora_target_modules")),
        max_loras_per_batch=per_batch,
        max_loaded_loras=max_loaded,
        eviction_policy=policy,
    )


def _target_modules(value: Any) -> tuple[str, ...]:
    """--lora-target-modules: None or 'all' allow every supported projection; 'qkv_proj' and
    'gate_up_proj' (SGLang's fused names) stand for their parts."""
    if value is None:
        return SUPPORTED_TARGET_MODULES
    names = [value] if isinstance(value, str) else list(value)
    if not names or "all" in names:
        return SUPPORTED_TARGET_MODULES
    expanded: list[str] = []
    for name in names:
        if name == "qkv_proj":
            expanded += ["q_proj", "k_proj", "v_proj"]
        elif name == "gate_up_proj":
            expanded += ["gate_proj", "up_proj"]
        elif name in SUPPORTED_TARGET_MODULES:
            expanded.append(name)
        else:
            raise ValueError(
                f"--lora-target-modules: {name!r} is not supported on this model family; "
                f"supported: {', '.join(SUPPORTED_TARGET_MODULES)}, qkv_proj, gate_up_proj, all"
            )
    return tuple(m for m in SUPPORTED_TARGET_MODULES if m in expanded)
