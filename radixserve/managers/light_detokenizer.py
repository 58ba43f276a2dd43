"""A decode-only tokenizer on the `tokenizers` library alone, for the detokenizer process.

Loading a Hugging Face tokenizer through transformers pulls torch into the process (~300 MB of
resident memory for a process that only turns ids into text). When the model's tokenizer is a
plain fast tokenizer, its `decode` is the Rust tokenizer's decode and nothing else, so the
detokenizer can run on that alone. The scheduler (which loads the full tokenizer anyway) decides
whether that holds, by checking the decoder against the full tokenizer on probe sequences, and
hands the serialized Rust tokenizer over in SchedulerReady; anything that does not pass keeps
the full tokenizer.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger(__name__)

PROBE_TEXTS = (
    "Hello , world . It 's a test ! Isn 't it ? ( yes ) \" quoted \" don't",
    "  leading spaces, trailing  \n\nnew lines\tand tabs  ",
    "Unicode: café, naïve, 東京, emoji 🙂, ∑ x² ≤ ∞",
    "def f(x):\n    return {'a': [1, 2, 3]}  # code",
)


class LightDecoder:
    """Same `decode` signature as the HF tokenizer, as IncrementalDetokenizer calls it."""

    def __init__(self, tokenizer_json: str) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_str(tokenizer_json)

    def decode(
        self,
        ids: Sequence[int],
        skip_special_tokens: bool = False,
        spaces_between_special_tokens: bool = True,
    ) -> str:
        # HF fast tokenizers accept and ignore spaces_between_special_tokens as well.
        del spaces_between_special_tokens
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def light_decoder_source(tokenizer: Any, seed: int = 0) -> str | None:
    """The serialized Rust tokenizer when decoding with it alone equals `tokenizer.decode`
    on every probe; None (keep the full tokenizer) otherwise."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not getattr(tokenizer, "is_fast", False):
        return None
    try:
        source = backend.to_str()
        light = LightDecoder(source)
    except Exception as e:  # an exotic tokenizer: not worth failing the start for
        logger.info("detokenizer keeps the full tokenizer (%s)", e)
        return None
    for ids in _probe_sequences(tokenizer, seed):
        for skip in (True, False):
            if light.decode(ids, skip_special_tokens=skip) != tokenizer.decode(
                ids, skip_special_tokens=skip
            ):
                logger.info("detokenizer keeps the full tokenizer: decode differs on %s", ids[:16])
                return None
    return source


def _probe_sequences(tokenizer: Any, seed: int) -> list[list[int]]:
    """Encoded texts (spaces before punctuation catch a clean-up step), every special token
    inside text, and random id runs that split multi-byte characters."""
    rng = random.Random(seed)
    vocab = len(tokenizer)
    probes = [list(tokenizer.encode(t, add_special_tokens=False)) for t in PROBE_TEXTS]
    specials = [i for i in getattr(tokenizer, "all_special_ids", []) if 0 <= i < vocab]
    words = probes[0][:6]
    probes += [words[:3] + [s] + words[3:] for s in specials]
    probes += [[rng.randrange(vocab) for _ in range(rng.randint(1, 24))] for _ in range(64)]
    return [p for p in probes if p]
