"""`--tool-call-parser gpt-oss`: harmony tool calls (OpenAI's gpt-oss).

A call is a message addressed to a function: `<|channel|>commentary to=functions.NAME
<|constrain|>json<|message|>{ARGS}<|call|>` (the recipient may also sit in the role part,
`<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>...`). Text outside
call messages is normal text. `<|call|>` is one of gpt-oss's stop tokens, so a reply usually
ends right after the arguments with no terminator: at the end of a reply an unterminated call
counts when its arguments are whole JSON.
"""

from __future__ import annotations

from radixserve.parsers import harmony as h
from radixserve.parsers.tool_calls.base import ParseResult, ToolCall, ToolCallParser, make_call
from radixserve.parsers.tool_calls.json_util import decode_at, skip_ws

_ROLE_RECIPIENT = "to="
# Longest `to=functions.NAME<|channel|>commentary json` header held back while it arrives; a
# longer run of text after a delta that happens to start with "to=" is sent on.
_MAX_ROLE_HEADER = 160


class HarmonyToolParser(ToolCallParser):
    name = "gpt-oss"
    start = h.CHANNEL

    def _scan(self, text: str, pos: int, at_start: bool = True) -> tuple[int, int]:
        """(where the next call message starts, where its arguments start) from `pos`:
        (-1, -1) when there is none; (start, -1) while its header is still incomplete.
        `at_start`: `text` opens the reply, where the header may begin with the recipient
        (the prompt ends with the role, `<|start|>assistant`)."""
        while True:
            idx, _ = h.first_of(text, h.OPENERS, pos)
            if at_start and pos == 0 and text.lstrip().startswith(_ROLE_RECIPIENT):
                idx = len(text) - len(text.lstrip())
            if idx < 0:
                return -1, -1
            body = text.find(h.MESSAGE, idx)
            if body < 0:
                return idx, -1
            if h.parse_header(text[idx:body]).recipient is not None:
                return idx, body + len(h.MESSAGE)
            pos = body + len(h.MESSAGE)

    def find_start(self, text: str, at_start: bool = True) -> int:
        idx, body = self._scan(text, 0, at_start)
        return idx if body >= 0 else -1

    def hold_len(self, text: str) -> int:
        stripped = text.lstrip()
        if (
            stripped
            and len(stripped) <= _MAX_ROLE_HEADER
            and (_ROLE_RECIPIENT.startswith(stripped) or stripped.startswith(_ROLE_RECIPIENT))
        ):
            # Maybe a reply opening with its recipient: hold it all, leading space included
            # (text sent on would make the streamer treat what follows as mid-reply).
            return len(text)
        idx, body = self._scan(text, 0)
        if idx >= 0 and body < 0:
            return len(text) - idx  # a header still arriving: it may address a function
        return h.hold_len(text, h.OPENERS)

    def parse(self, text: str, final: bool = True) -> ParseResult:
        normal: list[str] = []
        calls: list[ToolCall] = []
        pos = 0
        while True:
            idx, body = self._scan(text, pos)
            if idx < 0 or body < 0:
                normal.append(text[pos:])
                break
            normal.append(text[pos:idx])
            recipient = h.parse_header(text[idx:body]).recipient or ""
            name = recipient.removeprefix(h.FUNCTIONS_PREFIX)
            end, marker = h.first_of(text, h.BODY_ENDS, body)
            if end < 0:
                # Stopped at `<|call|>` (trimmed) or cut off: a call only if its JSON is whole.
                call = self._unterminated(name, text[body:]) if final else None
                if call is not None:
                    calls.append(call)
                elif final:
                    normal.append(text[idx:])  # malformed or cut off: keep the text
                break
            args = text[body:end].strip()
            call = make_call(name, args or None, self.known)
            if call is not None:
                calls.append(call)
            pos = end if marker in h.OPENERS else end + len(marker)
        joined = "".join(normal)
        return ParseResult(joined.strip() if calls else joined, calls)

    def _unterminated(self, name: str, args: str) -> ToolCall | None:
        if not args.strip():
            return make_call(name, None, self.known)
        decoded = decode_at(args, skip_ws(args, 0))
        if decoded is None or args[decoded[1] :].strip():
            return None
        return make_call(name, decoded[0], self.known)


__all__ = ["HarmonyToolParser"]
