"""Loading a tokenizer without importing torch, for the API process.

`AutoTokenizer` lives in transformers' auto modules, which import the configuration code, which
imports torch (~270 MB resident, ~1 s). The tokenizer classes themselves do not. So the API
process loads the class a folder's tokenizer_config.json names, straight from transformers'
top-level namespace, when the folder is the plain case (no remote code, no Mistral tekken
file, no Llama class over a byte-level tokenizer.json, where AutoTokenizer substitutes its own
choice).

AutoTokenizer has more rules (per-model-type corrections of hub classes), so the prediction
is checked: the scheduler process loads the tokenizer with AutoTokenizer and reports its class
(`tokenizer_class_name`); when that differs, the API process loads that class instead
(`load_named_class`), still without AutoTokenizer, as long as it is one of transformers' own.
Either way the class is then called as AutoTokenizer calls it: `cls.from_pretrained(folder)`.

AutoTokenizer's choice is also remembered per folder (`remember_class`, a start-up record
named by a hash of what the choice depends on: the folder's tokenizer_config.json and
config.json bytes, its file names, tokenizer.json's size and time, and the transformers and
tokenizers versions), so later starts of the scheduler load that class directly too.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

_TRANSFORMERS = "transformers."
KIND = "tokenizer-class"
FORMAT = "1"


def tokenizer_class_name(tokenizer: Any) -> str:
    """A tokenizer's class as "module:qualname" (what SchedulerReady carries)."""
    cls = type(tokenizer)
    return f"{cls.__module__}:{cls.__qualname__}"


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _byte_level(tokenizer_json: Path) -> bool:
    """Whether tokenizer.json declares a ByteLevel pre-tokenizer or decoder (AutoTokenizer then
    loads a declared LlamaTokenizer as TokenizersBackend); True when unreadable, to be safe."""
    data = _read_json(tokenizer_json)
    if data is None:
        return True
    text = json.dumps([data.get("pre_tokenizer"), data.get("decoder")])
    return '"ByteLevel"' in text


def predicted_class(folder: str | os.PathLike[str]) -> type[Any] | None:
    """The class AutoTokenizer should load for the local `folder`, or None when the folder is
    not the plain case (the caller then uses AutoTokenizer itself)."""
    path = Path(folder)
    if not path.is_dir() or (path / "tekken.json").exists():
        return None
    config = _read_json(path / "tokenizer_config.json")
    if config is None or "auto_map" in config:
        return None
    name = config.get("tokenizer_class")
    if not isinstance(name, str) or not name:
        return None
    base = name.removesuffix("Fast")
    if base == "LlamaTokenizer" and _byte_level(path / "tokenizer.json"):
        return None
    import transformers

    # transformers 4 prefers the Fast class of a slow name; 5 aliases XFast to X.
    for candidate in (f"{base}Fast", base):
        cls = getattr(transformers, candidate, None)
        if isinstance(cls, type):
            if cls.__name__ == "PythonBackend":  # AutoTokenizer swaps in the fast backend
                return getattr(transformers, "TokenizersBackend", None)
            return cls
    return None


def load_named_class(class_name: str, folder: str | os.PathLike[str]) -> Any | None:
    """`folder`'s tokenizer loaded with the transformers class `class_name` ("module:qualname",
    from tokenizer_class_name); None for a class outside transformers (remote code)."""
    module_name, _, qualname = class_name.partition(":")
    if not module_name.startswith(_TRANSFORMERS) or not qualname or "." in qualname:
        return None
    cls = getattr(importlib.import_module(module_name), qualname, None)
    if not isinstance(cls, type):
        return None
    return cls.from_pretrained(os.fspath(folder))


def load_predicted(folder: str | os.PathLike[str]) -> Any | None:
    """`folder`'s tokenizer through predicted_class; None when there is no prediction."""
    cls = predicted_class(folder)
    if cls is None:
        return None
    return cls.from_pretrained(os.fspath(folder))


def choice_key(folder: Path) -> str | None:
    from radixserve.utils.startup_cache import key_of, package_version

    try:
        names = sorted(p.name for p in folder.iterdir())
        parts: list[str | bytes] = [FORMAT, str(folder.resolve()), "\0".join(names)]
        for name in ("tokenizer_config.json", "config.json"):
            path = folder / name
            parts.append(path.read_bytes() if path.is_file() else b"")
        # Only its ByteLevel-ness matters (see _byte_level): size and time stand for it.
        tokenizer_json = folder / "tokenizer.json"
        if tokenizer_json.is_file():
            stat = tokenizer_json.stat()
            parts.append(f"{stat.st_size}:{stat.st_mtime_ns}")
    except OSError:
        return None
    parts += [package_version("transformers"), package_version("tokenizers")]
    return key_of(parts)


def remembered_class(folder: str | os.PathLike[str]) -> str | None:
    """The class AutoTokenizer chose for the local `folder` at an earlier start, if any."""
    from radixserve.utils.startup_cache import read_record

    path = Path(folder)
    key = choice_key(path) if path.is_dir() else None
    record = read_record(KIND, key) if key is not None else None
    name = record.get("class") if record is not None else None
    return name if isinstance(name, str) and name.startswith(_TRANSFORMERS) else None


def remember_class(folder: str | os.PathLike[str], tokenizer: Any) -> None:
    """Remember the class of `tokenizer`, which AutoTokenizer loaded from the local `folder`
    (one of transformers' own classes only: remote code is never loaded by name)."""
    from radixserve.utils.startup_cache import write_record

    path = Path(folder)
    name = tokenizer_class_name(tokenizer)
    key = choice_key(path) if path.is_dir() and name.startswith(_TRANSFORMERS) else None
    if key is not None:
        write_record(KIND, key, {"class": name})
