"""The scheduler's tokenizer on a warm start: decode-only, without transformers.

The scheduler process uses its tokenizer for little: decoding output tails (stop strings,
the radix-tree dashboard), the EOS and BOS ids, and building a grammar backend for the first
constrained request. Its start-up still imported transformers' tokenizer code for it
(~0.6-1 s on 2 cores, ~40 MB resident). Where decoding with the `tokenizers` library alone
equals the full tokenizer's decode (the check that already lets the detokenizer process run
without transformers: managers/light_detokenizer.py), the first start remembers that decoder
with the special ids and AutoTokenizer's class choice, in a start-up record named like the
class record (utils/light_tokenizer.py: the folder's tokenizer files and the library
versions). Later starts build a DecodeOnlyTokenizer from it; anything else asked of it (a
grammar backend's vocabulary) loads the full tokenizer then, once.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from radixserve.managers.light_detokenizer import LightDecoder

logger = logging.getLogger(__name__)

KIND = "scheduler-tokenizer"


class DecodeOnlyTokenizer:
    """Decodes with the remembered `tokenizers` decoder and knows the special ids; any other
    attribute comes from the full tokenizer, loaded on first use by `load_full`."""

    def __init__(self, record: dict[str, Any], load_full: Callable[[], Any]) -> None:
        self.light_decoder_source: str = record["light_decoder"]
        self.class_name: str = record["class"]
        self.eos_token_id: int | None = record.get("eos_token_id")
        self.bos_token_id: int | None = record.get("bos_token_id")
        self._decoder = LightDecoder(self.light_decoder_source)
        self._load_full = load_full
        self._full: Any = None
        self._lock = threading.Lock()

    def decode(
        self,
        ids: Sequence[int],
        skip_special_tokens: bool = False,
        spaces_between_special_tokens: bool = True,
    ) -> str:
        return self._decoder.decode(ids, skip_special_tokens, spaces_between_special_tokens)

    @property
    def full(self) -> Any:
        """The full tokenizer (loaded now if not yet)."""
        with self._lock:
            if self._full is None:
                logger.info("Loading the full tokenizer (first use beyond decoding)")
                self._full = self._load_full()
            return self._full

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not set yet (during __init__) or private: no full load
            raise AttributeError(name)
        return getattr(self.full, name)


def full_tokenizer(tokenizer: Any) -> Any:
    """The full tokenizer behind `tokenizer` (itself unless it is decode-only)."""
    return tokenizer.full if isinstance(tokenizer, DecodeOnlyTokenizer) else tokenizer


def _key(folder: Path) -> str | None:
    from radixserve.utils.light_tokenizer import choice_key

    return choice_key(folder) if folder.is_dir() else None


def remembered(folder: str | os.PathLike[str], load_full: Callable[[], Any]) -> Any | None:
    """A DecodeOnlyTokenizer for the local `folder` from an earlier start's record, or None."""
    from radixserve.utils.startup_cache import read_record

    key = _key(Path(folder))
    record = read_record(KIND, key) if key is not None else None
    if record is None or not isinstance(record.get("light_decoder"), str):
        return None
    try:
        return DecodeOnlyTokenizer(record, load_full)
    except Exception as e:  # an unreadable decoder: the full tokenizer, as without a record
        logger.debug("remembered decoder of %s unusable: %s", folder, e)
        return None


def remember(folder: str | os.PathLike[str], tokenizer: Any, light_decoder: str) -> None:
    """Remember what a DecodeOnlyTokenizer needs of `tokenizer`, AutoTokenizer's (or its
    class's) tokenizer of the local `folder`, whose decoder `light_decoder` has passed the
    check against it."""
    from radixserve.utils.light_tokenizer import tokenizer_class_name
    from radixserve.utils.startup_cache import write_record

    key = _key(Path(folder))
    if key is None:
        return
    record = {
        "light_decoder": light_decoder,
        "class": tokenizer_class_name(tokenizer),
        "eos_token_id": getattr(tokenizer, "eos_token_id", None),
        "bos_token_id": getattr(tokenizer, "bos_token_id", None),
    }
    write_record(KIND, key, record)
