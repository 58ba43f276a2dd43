"""`--reasoning-parser gpt-oss`: harmony channels -> reasoning and content (SGLang's
GptOssDetector semantics).

The analysis channel is reasoning; the final channel, and commentary without a recipient (a
preamble before tool calls), are content. A message addressed to a tool (`to=functions.NAME`)
passes on into the content in a normalized raw form, `<|channel|>commentary
to=functions.NAME<|message|>ARGS<|call|>`, so the `gpt-oss` tool-call parser finds it. Output with
no harmony markers at all is plain content.
"""

from __future__ import annotations

import logging

from radixserve.parsers import harmony as h
from radixserve.parsers.reasoning import ReasoningSplit

logger = logging.getLogger(__name__)

_HEADER_ENDS = (h.MESSAGE, h.END, h.CALL, h.RETURN)
# How a reply that speaks harmony can begin (the prompt ends with `<|start|>assistant`).
_HARMONY_BEGINNINGS = ("<|", "to=")


def _looks_harmony(text: str) -> bool | None:
    """True / False once decided from the first non-space text; None while undecided."""
    if any(text.startswith(b) for b in _HARMONY_BEGINNINGS):
        return True
    if any(b.startswith(text) for b in _HARMONY_BEGINNINGS):
        return None
    return False


class HarmonyReasoningParser:
    """One request's harmony splitter, with ReasoningParser's interface (`parse`, `feed`,
    `flush`).

    Invariant: each message body is emitted once, in order, to reasoning or content; markers
    and headers are not emitted (except a tool message's normalized header and terminator).
    A tail that may be the start of a marker is held until the next delta or `flush`.
    """

    def __init__(self, stream_reasoning: bool = True) -> None:
        self.stream_reasoning = stream_reasoning
        self._mode = "start"  # start | plain | header | body
        self._kind = "content"  # body of: reasoning | content | tool
        self._header = ""
        self._buffer = ""
        self._held_reasoning = ""
        self._reasoning: list[str] = []
        self._content: list[str] = []

    def parse(self, text: str) -> ReasoningSplit:
        first, last = self.feed(text), self.flush()
        reasoning = (first.reasoning + last.reasoning).strip()
        return ReasoningSplit(reasoning, (first.content + last.content).strip())

    def feed(self, delta: str) -> ReasoningSplit:
        text, self._buffer = self._buffer + delta, ""
        while text:
            text = self._step(text)
        return self._take()

    def flush(self) -> ReasoningSplit:
        """End of stream: release held text. An unfinished body keeps what arrived; a header
        cut off before `<|message|>` carries no text and is dropped."""
        text, self._buffer = self._buffer, ""
        if self._mode in ("start", "plain"):
            self._content.append(text)
        elif self._mode == "body":
            self._emit(text)
        else:
            header, self._header = self._header + text, ""
            if header.strip() and not any(m in header for m in h.MARKERS):
                self._content.append(header)  # stray plain text between messages
            elif header.strip():
                logger.debug("Dropped an unfinished harmony header %r.", header)
        self._release_reasoning()
        return self._take()

    def _take(self) -> ReasoningSplit:
        out = ReasoningSplit("".join(self._reasoning), "".join(self._content))
        self._reasoning, self._content = [], []
        return out

    def _step(self, text: str) -> str:
        """Consume a prefix of `text`; return the rest ("" when all is consumed or held)."""
        if self._mode == "start":
            decided = _looks_harmony(text.lstrip())
            if decided is None or not text.strip():
                self._buffer = text
                return ""
            self._mode = "header" if decided else "plain"
            return text
        if self._mode == "plain":
            self._content.append(text)
            return ""
        if self._mode == "header":
            return self._step_header(text)
        return self._step_body(text)

    def _step_header(self, text: str) -> str:
        idx, marker = h.first_of(text, _HEADER_ENDS)
        if idx < 0:
            keep = h.hold_len(text, _HEADER_ENDS)
            self._header += text[: len(text) - keep]
            self._buffer = text[len(text) - keep :]
            return ""
        header, self._header = self._header + text[:idx], ""
        if marker == h.MESSAGE:
            self._open(header)
            self._mode = "body"
        return text[idx + len(marker) :]

    def _step_body(self, text: str) -> str:
        idx, marker = h.first_of(text, h.BODY_ENDS)
        if idx < 0:
            keep = h.hold_len(text, h.BODY_ENDS)
            self._emit(text[: len(text) - keep])
            self._buffer = text[len(text) - keep :]
            return ""
        self._emit(text[:idx])
        self._mode = "header"
        if marker in h.OPENERS:
            # A new message without the old one's end marker: the marker starts its header.
            self._close(h.CALL)
            return text[idx:]
        self._close(marker)
        return text[idx + len(marker) :]

    def _open(self, header: str) -> None:
        parsed = h.parse_header(header)
        if parsed.recipient is not None:
            self._kind = "tool"
            channel = parsed.channel or "commentary"
            self._content.append(f"{h.CHANNEL}{channel} to={parsed.recipient}{h.MESSAGE}")
        elif parsed.channel == "analysis":
            self._kind = "reasoning"
        else:
            self._kind = "content"

    def _emit(self, text: str) -> None:
        if not text:
            return
        if self._kind != "reasoning":
            self._content.append(text)
        elif self.stream_reasoning:
            self._reasoning.append(text)
        else:
            self._held_reasoning += text

    def _close(self, marker: str) -> None:
        if self._kind == "tool":
            self._content.append(marker)
        self._release_reasoning()

    def _release_reasoning(self) -> None:
        if self._held_reasoning:
            self._reasoning.append(self._held_reasoning)
            self._held_reasoning = ""
