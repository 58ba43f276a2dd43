"""Incremental detokenization: turn a growing list of token ids into text deltas.

Decoding token by token breaks multi-byte characters and word-piece spacing, so each step
decodes a short window (from a "surrogate" offset) and emits only the stable new part. Text that
could still become a stop string is held back, so streamed text always equals the final text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Any,
        *,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        stop_strings: Sequence[str] = (),
        no_stop_trim: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.spaces_between_special_tokens = spaces_between_special_tokens
        self.stop_strings = [s for s in stop_strings if s]
        self.no_stop_trim = no_stop_trim
        self.ids: list[int] = []
        self.text = ""  # everything decoded so far (stable part)
        self.sent = 0  # characters of self.text already emitted
        self.surr_offset = 0
        self.read_offset = 0

    def _decode(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:  # --skip-tokenizer-init: clients read output_ids
            return ""
        kwargs: dict[str, Any] = {"skip_special_tokens": self.skip_special_tokens}
        if not self.spaces_between_special_tokens:
            kwargs["spaces_between_special_tokens"] = False
        try:
            return self.tokenizer.decode(list(ids), **kwargs)
        except TypeError:  # fast tokenizers without that keyword
            kwargs.pop("spaces_between_special_tokens", None)
            return self.tokenizer.decode(list(ids), **kwargs)

    def add(self, new_ids: Sequence[int], finished: bool, matched_stop: str | int | None) -> str:
        """Append tokens; return the text delta that is safe to send now. `matched_stop`: the
        stop string, or the stop token id (EOS or a stop_token_ids entry), that finished it."""
        if finished and _is_token_id(matched_stop) and new_ids and not self.no_stop_trim:
            # SGLang leaves the stop token out of the text (output_ids keep it). It shows only
            # with skip_special_tokens off, where gpt-oss's `<|return|>` / `<|call|>` would
            # otherwise end every reply.
            new_ids = list(new_ids)[:-1]
        self.ids.extend(new_ids)
        if new_ids:
            prefix = self._decode(self.ids[self.surr_offset : self.read_offset])
            full = self._decode(self.ids[self.surr_offset :])
            if finished or not full.endswith(REPLACEMENT_CHAR):
                self.text += full[len(prefix) :]
                self.surr_offset = self.read_offset
                self.read_offset = len(self.ids)
        if finished:
            final = self._final_text(matched_stop if isinstance(matched_stop, str) else None)
            delta = final[self.sent :]
            self.sent = len(final)
            return delta
        limit = len(self.text) - self._stop_prefix_holdback()
        delta = self.text[self.sent : limit] if limit > self.sent else ""
        self.sent = max(self.sent, limit)
        return delta

    def _final_text(self, matched_stop: str | None) -> str:
        text = self.text
        # Only stop strings are cut; a stop regex reports its pattern and keeps the matched text.
        if matched_stop and matched_stop in self.stop_strings and not self.no_stop_trim:
            cut = text.find(matched_stop, max(self.sent - len(matched_stop), 0))
            if cut < 0:
                cut = text.find(matched_stop)
            if cut >= 0:
                text = text[:cut]
        return text

    def _stop_prefix_holdback(self) -> int:
        """Length of the longest suffix of the text that is a prefix of (or contains) a stop
        string: it might turn into a stop string the client must not see."""
        hold = 0
        for stop in self.stop_strings:
            for k in range(min(len(stop), len(self.text)), 0, -1):
                if self.text.endswith(stop[:k]):
                    hold = max(hold, k)
                    break
        return hold


def _is_token_id(matched: object) -> bool:
    return isinstance(matched, int) and not isinstance(matched, bool)
