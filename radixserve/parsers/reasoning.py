"""`--reasoning-parser`: split `<think>...</think>` reasoning from the answer (SGLang's semantics).

deepseek-r1 and qwen3-thinking assume the output starts inside the reasoning (their chat
templates put `<think>` in the prompt), so text before `</think>` is reasoning even without an
opening tag. qwen3 treats text as reasoning only once `<think>` appears.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple

logger = logging.getLogger(__name__)

THINK_START = "<think>"
THINK_END = "</think>"


@dataclass(frozen=True)
class ReasoningFormat:
    start: str = THINK_START
    end: str = THINK_END
    # True: output begins inside the reasoning block, with or without the opening tag.
    force_reasoning: bool = False


FORMATS: dict[str, ReasoningFormat] = {
    "deepseek-r1": ReasoningFormat(force_reasoning=True),
    "qwen3": ReasoningFormat(force_reasoning=False),
    "qwen3-thinking": ReasoningFormat(force_reasoning=True),
}


class ReasoningSplit(NamedTuple):
    reasoning: str
    content: str


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


class ReasoningParser:
    """One request's reasoning splitter; `parse` for whole texts, `feed` for stream deltas.

    Invariant: in streaming, everything fed is emitted exactly once (as reasoning or content)
    except the tags themselves and a held-back tail that may be the start of a tag; `flush`
    releases that tail at the end of the stream.
    """

    def __init__(self, name: str, stream_reasoning: bool = True) -> None:
        if name not in FORMATS:
            raise ValueError(
                f"reasoning_parser {name!r} is not supported; expected one of {sorted(FORMATS)}"
            )
        self.fmt = FORMATS[name]
        self.stream_reasoning = stream_reasoning
        # "before": may still see <think>; "reasoning": inside the block; "content": after it.
        self._mode = "reasoning" if self.fmt.force_reasoning else "before"
        self._seen_start = False
        self._buffer = ""
        self._held_reasoning = ""
        self._strip_lead = False  # drop the whitespace between </think> and the answer

    def _lead(self, text: str) -> str:
        if self._strip_lead:
            text = text.lstrip()
            self._strip_lead = not text
        return text

    def parse(self, text: str) -> ReasoningSplit:
        fmt = self.fmt
        if not (fmt.force_reasoning or fmt.start in text):
            return ReasoningSplit("", text)
        body = text.replace(fmt.start, "", 1).strip()
        if fmt.end not in body:
            # Cut off mid-thought: all of it is reasoning.
            return ReasoningSplit(body, "")
        reasoning, _, content = body.partition(fmt.end)
        return ReasoningSplit(reasoning.strip(), content.strip())

    def feed(self, delta: str) -> ReasoningSplit:
        text, self._buffer = self._buffer + delta, ""
        if self._mode == "content":
            return ReasoningSplit("", self._lead(text))
        if self._mode == "before":
            return self._feed_before(text)
        return self._feed_reasoning(text)

    def _feed_before(self, text: str) -> ReasoningSplit:
        idx = text.find(self.fmt.start)
        if idx >= 0:
            self._mode, self._seen_start = "reasoning", True
            inner = self._feed_reasoning(text[idx + len(self.fmt.start) :])
            return ReasoningSplit(inner.reasoning, text[:idx] + inner.content)
        keep = _partial_suffix(text, self.fmt.start)
        self._buffer = text[len(text) - keep :]
        return ReasoningSplit("", text[: len(text) - keep])

    def _feed_reasoning(self, text: str) -> ReasoningSplit:
        fmt = self.fmt
        if not self._seen_start:
            stripped = text.lstrip()
            if stripped.startswith(fmt.start):
                self._seen_start = True
                text = stripped[len(fmt.start) :]
            elif fmt.start.startswith(stripped):
                # Maybe the opening tag, split across deltas: wait for more.
                self._buffer = text
                return ReasoningSplit("", "")
            else:
                self._seen_start = True  # no opening tag (deepseek-r1 style)
        idx = text.find(fmt.end)
        if idx >= 0:
            self._mode = "content"
            reasoning = self._held_reasoning + text[:idx]
            self._held_reasoning = ""
            self._strip_lead = True
            return ReasoningSplit(reasoning, self._lead(text[idx + len(fmt.end) :]))
        keep = _partial_suffix(text, fmt.end)
        out, self._buffer = text[: len(text) - keep], text[len(text) - keep :]
        if not self.stream_reasoning:
            self._held_reasoning += out
            return ReasoningSplit("", "")
        return ReasoningSplit(out, "")

    def flush(self) -> ReasoningSplit:
        """End of stream: release held text (a partial tag that never completed)."""
        text, self._buffer = self._buffer, ""
        held, self._held_reasoning = self._held_reasoning, ""
        if self._mode == "reasoning":
            return ReasoningSplit(held + text, "")
        return ReasoningSplit(held, text)
