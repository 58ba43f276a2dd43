"""Decides whether a request is done after each new token: EOS, stop ids, stop strings, length."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from radixserve.messages import FinishReason

if TYPE_CHECKING:
    from radixserve.managers.schedule_batch import Req

# Extra tokens decoded beyond the longest stop string, so a stop string that starts inside a
# multi-byte token sequence is still seen whole.
STOP_TAIL_SLACK_TOKENS = 8


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
