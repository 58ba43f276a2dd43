"""The bytes each token stands for, and which tokens are special, read from a fast Hugging
Face tokenizer.

outlines-core's own builder (``Vocabulary.from_pretrained``) only loads a tokenizer from the
Hub by name, and radixserve's tokenizers are local (often converted from a GGUF), so this
builds the same ``bytes -> ids`` map outlines-core wants from the tokenizer at hand. Two token
spellings exist among Hugging Face tokenizers:
- byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM): each byte is spelled as one printable
  character (GPT-2's ``bytes_to_unicode`` table);
- SentencePiece (Llama 2, Mistral): ``▁`` is a space and ``<0xAB>`` is the raw byte 0xAB.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from functools import cache
from typing import Any

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_SPIECE_SPACE = "\u2581"


@cache
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's table inverted: printable character -> the byte it spells."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    chars = list(printable)
    byte_values = list(printable)
    shift = 0
    for byte in range(256):
        if byte not in byte_values:
            byte_values.append(byte)
            chars.append(256 + shift)
            shift += 1
    return {chr(c): b for c, b in zip(chars, byte_values, strict=True)}


def token_spelling(tokenizer: Any) -> str:
    """'byte_level' or 'sentencepiece', from the fast tokenizer's decoder; ValueError else."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError("the outlines grammar backend needs a fast (Rust) Hugging Face tokenizer")
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    kinds = _decoder_types(decoder)
    if "ByteLevel" in kinds:
        return "byte_level"
    if kinds & {"ByteFallback", "Metaspace"} or _replaces_spiece_space(decoder):
        return "sentencepiece"
    raise ValueError(
        f"the outlines grammar backend cannot read tokens of a tokenizer with decoder(s) "
        f"{sorted(kinds) or 'none'}"
    )


def _decoder_types(decoder: dict[str, Any]) -> set[str]:
    kinds = {str(decoder.get("type"))}
    for child in decoder.get("decoders") or []:
        kinds |= _decoder_types(child)
    return kinds


def _replaces_spiece_space(decoder: dict[str, Any]) -> bool:
    if decoder.get("type") == "Replace":
        return (decoder.get("pattern") or {}).get("String") == _SPIECE_SPACE
    return any(_replaces_spiece_space(child) for child in decoder.get("decoders") or [])


def special_token_ids(tokenizer: Any) -> set[int]:
    """Ids of the tokenizer's special tokens (``<|im_start|>`` and the like), which stand for
    no text and so must never match text in a grammar."""
    ids = {int(i) for i in getattr(tokenizer, "all_special_ids", ()) or ()}
    added: dict[int, Any] = dict(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    ids |= {int(i) for i, tok in added.items() if getattr(tok, "special", False)}
    return ids


def token_bytes_map(
    tokenizer: Any, vocab_size: int, exclude: Iterable[int] = ()
) -> dict[bytes, list[int]]:
    """``bytes -> token ids`` for every ordinary token below ``vocab_size``: special tokens
    (which never stand for text) and ``exclude`` are left out."""
    spelling = token_spelling(tokenizer)
    skipped = set(exclude) | special_token_ids(tokenizer)
    added: dict[int, Any] = dict(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    out: dict[bytes, list[int]] = {}
    for token, token_id in tokenizer.get_vocab().items():
        if token_id in skipped or not 0 <= token_id < vocab_size:
            continue
        if token_id in added:
            # Added (non-special) tokens are stored as plain text, not in the byte spelling.
            raw = str(getattr(added[token_id], "content", token)).encode("utf-8")
        elif spelling == "byte_level":
            raw = _byte_level_bytes(token)
        else:
            raw = _sentencepiece_bytes(token)
        if raw:
            out.setdefault(raw, []).append(token_id)
    return out


def _byte_level_bytes(token: str) -> bytes:
    table = _byte_level_decoder()
    try:
        return bytes(table[c] for c in token)
    except KeyError:  # a character outside the byte alphabet: the token is plain text
        return token.encode("utf-8")


def _sentencepiece_bytes(token: str) -> bytes:
    match = _BYTE_TOKEN.match(token)
    if match:
        return bytes([int(match.group(1), 16)])
    return token.replace(_SPIECE_SPACE, " ").encode("utf-8")
