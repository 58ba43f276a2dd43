"""A model folder's transformers config, remembered as its attributes so a later start reads them
back without transformers: `AutoConfig.from_pretrained` imports transformers' configuration
modules, which import torch.distributed.tensor and more (~1-1.7 s of a scheduler's start-up on
2 cores, and most of what the process would import transformers for).

The record holds what radixserve reads from a config, which is only attributes by name
(`getattr(hf_config, name, default)`; models/config.py is the main reader): `to_dict()`, the
class's attribute_map aliases, and `rope_scaling` (transformers 5 keeps it as a property).
Each value is checked to read back equal before the record is written; a config whose values
do not (sub-configs, per-layer configs, remote code, values JSON cannot hold) is never
remembered, and AutoConfig keeps building it every start, as before. The record's name hashes
the folder, its config.json bytes and transformers' version (utils/startup_cache.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from radixserve.utils.startup_cache import key_of, package_version, read_record, write_record

logger = logging.getLogger(__name__)

KIND = "hf-config"
FORMAT = "1"
# Read by radixserve but not in to_dict(): properties of transformers' config classes.
_PROPERTIES = ("rope_scaling",)
# to_dict() turns these into strings; radixserve does not read them from the config.
_CONVERTED = ("dtype", "torch_dtype")
# Classification-head labels (int keys, which JSON turns into strings): not read by radixserve.
_IGNORED = ("id2label", "label2id")


class ConfigSnapshot(SimpleNamespace):
    """A transformers config's attributes, read back by name as radixserve reads configs."""

    def update(self, values: Mapping[str, Any]) -> None:
        """As PreTrainedConfig.update: set each attribute (--json-model-override-args)."""
        for name, value in values.items():
            setattr(self, name, value)

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def _key(folder: Path) -> str | None:
    try:
        config_bytes = (folder / "config.json").read_bytes()
    except OSError:
        return None
    parts = [FORMAT, str(folder.resolve()), package_version("transformers"), config_bytes]
    return key_of(parts)


def load_snapshot(source: str) -> ConfigSnapshot | None:
    """The remembered config of the local folder `source`, or None (not remembered yet)."""
    folder = Path(source)
    key = _key(folder) if folder.is_dir() else None
    record = read_record(KIND, key) if key is not None else None
    if record is None or not isinstance(record.get("attributes"), dict):
        return None
    return ConfigSnapshot(**record["attributes"])


def _lists(value: Any) -> Any:
    """`value` with tuples as lists (JSON's only sequence)."""
    if isinstance(value, tuple | list):
        return [_lists(v) for v in value]
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    return value


def snapshot_attributes(config: Any) -> dict[str, Any] | None:
    """The attributes to remember of a transformers config, or None when it cannot be
    remembered faithfully (read back equal, but for tuples coming back as lists)."""
    cls = type(config)
    if not cls.__module__.startswith("transformers."):
        return None  # remote code: its class may compute attributes of its own
    if getattr(cls, "sub_configs", None) or getattr(config, "is_heterogeneous", False):
        return None
    as_dict = config.to_dict()
    names = dict.fromkeys(as_dict)
    names.update(dict.fromkeys(getattr(cls, "attribute_map", None) or {}))
    names.update(dict.fromkeys(n for n in _PROPERTIES if hasattr(config, n)))
    attributes: dict[str, Any] = {}
    for name in names:
        if name in _IGNORED:
            continue
        value = as_dict[name] if name in _CONVERTED else getattr(config, name)
        try:
            back = json.loads(json.dumps(value))
        except (TypeError, ValueError):
            return None
        if back != _lists(value):
            return None
        attributes[name] = back
    return attributes


def save_snapshot(source: str, config: Any) -> None:
    """Remember `config`, built by AutoConfig from the local folder `source`."""
    folder = Path(source)
    key = _key(folder) if folder.is_dir() else None
    if key is None:
        return
    attributes = snapshot_attributes(config)
    if attributes is None:
        logger.debug("the config of %s is not remembered (not a plain config)", source)
        return
    write_record(KIND, key, {"attributes": attributes})
