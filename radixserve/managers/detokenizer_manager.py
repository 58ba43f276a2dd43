"""Turns scheduler outputs (token ids) into text deltas, one incremental detokenizer per
request. Runs in its own process behind the server (see detokenizer_process.py) or inline in
the in-process engine."""

from __future__ import annotations

import logging
from typing import Any

from radixserve.managers.detokenizer import IncrementalDetokenizer
from radixserve.messages import DetokParams, ReqOutput

logger = logging.getLogger(__name__)


class DetokenizerManager:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, IncrementalDetokenizer] = {}

    def handle(self, outputs: list[ReqOutput]) -> list[ReqOutput]:
        """Fill in `text` (the new text) on each output, in place; returns the same list."""
        for out in outputs:
            state = self.states.get(out.rid)
            if state is None:
                params = out.detok or DetokParams()
                state = IncrementalDetokenizer(
                    self.tokenizer,
                    skip_special_tokens=params.skip_special_tokens,
                    spaces_between_special_tokens=params.spaces_between_special_tokens,
                    stop_strings=params.stop_strings,
                    no_stop_trim=params.no_stop_trim,
                )
                self.states[out.rid] = state
            finished = out.finished is not None
            matched = out.finished.matched if finished else None
            try:
                out.text = state.add(
                    out.new_token_ids,
                    finished=finished,
                    matched_stop=matched if isinstance(matched, str | int) else None,
                )
            except Exception:  # a tokenizer failure must not take other requests down
                logger.exception("Detokenizing request %s failed", out.rid)
                out.text = ""
            if finished:
                del self.states[out.rid]
        return outputs
