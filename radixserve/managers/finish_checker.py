"""Decides whether a request is done after each new token: EOS, stop ids, stop strings, stop
regexes, length."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from radixserve.messages import FinishReason

if TYPE_CHECKING:
    from radixserve.managers.schedule_batch import Req

# Extra tokens decoded beyond the longest stop string, so a stop string that starts inside a
# multi-byte token sequence is still seen whole.
STOP_TAIL_SLACK_TOKENS = 8
# A stop regex is searched in the text of the last tokens: as many as its longest match has
# characters, at most this many (an unbounded pattern such as `\d+` sees this much text).
STOP_REGEX_MAX_WINDOW = 256


class FinishChecker:
    def __init__(self, eos_token_ids: Sequence[int], context_len: int, tokenizer: Any) -> None:
        self.eos_token_ids = frozenset(eos_token_ids)
        self.context_len = context_len
        self.tokenizer = tokenizer

    def check(self, req: Req) -> FinishReason | None:
        params = req.sampling_params
        last = req.output_ids[-1]
        if not params.ignore_eos and last in self.eos_token_ids:
            return FinishReason("stop", matched=last)
        if params.stop_token_ids and last in params.stop_token_ids:
            return FinishReason("stop", matched=last)
        if params.stop and self.tokenizer is not None:
            matched = self._match_stop_string(req)
            if matched is not None:
                return FinishReason("stop", matched=matched)
        if params.stop_regex and self.tokenizer is not None:
            pattern = self._match_stop_regex(req)
            if pattern is not None:
                # SGLang reports the pattern that matched (FINISHED_MATCHED_REGEX), and the
                # matched text stays in the output.
                return FinishReason("stop", matched=pattern)
        if len(req.output_ids) >= req.max_new_tokens:
            return FinishReason("length", matched=None)
        if req.seq_len >= self.context_len:
            return FinishReason("length", matched=None)
        return None

    def _match_stop_string(self, req: Req) -> str | None:
        stops = req.sampling_params.stop
        # A stop string of n characters spans at most n tokens.
        window = max(len(s) for s in stops) + STOP_TAIL_SLACK_TOKENS
        tail = self.tokenizer.decode(req.output_ids[-window:], skip_special_tokens=False)
        for stop in stops:
            if stop and stop in tail:
                return stop
        return None

    def _match_stop_regex(self, req: Req) -> str | None:
        patterns = req.sampling_params.stop_regex
        window = max(_max_match_len(p) for p in patterns) + STOP_TAIL_SLACK_TOKENS
        tail = self.tokenizer.decode(req.output_ids[-window:], skip_special_tokens=False)
        for pattern in patterns:
            if _compiled(pattern).search(tail) is not None:
                return pattern
        return None


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


@functools.lru_cache(maxsize=1024)
def _max_match_len(pattern: str) -> int:
    """Characters in the pattern's longest match, capped at STOP_REGEX_MAX_WINDOW."""
    try:
        from re import _parser  # type: ignore[attr-defined]

        width = _parser.parse(pattern).getwidth()[1]
    except Exception:  # a parser change must not stop generation; fall back to the cap
        return STOP_REGEX_MAX_WINDOW
    return min(int(width), STOP_REGEX_MAX_WINDOW)
