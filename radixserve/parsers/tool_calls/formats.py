"""The JSON-based wire formats: hermes / qwen25, llama3, mistral, and the forced-choice array."""

from __future__ import annotations

from radixserve.parsers.tool_calls.base import (
    ParseResult,
    ToolCall,
    ToolCallParser,
    call_from_object,
    make_call,
)
from radixserve.parsers.tool_calls.json_util import decode_at, scan_array, skip_ws

_ARG_KEYS = ("arguments", "parameters")


class HermesParser(ToolCallParser):
    """`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, repeated for parallel
    calls (Hermes and Qwen 2.5 / Qwen 3)."""

    name = "hermes"
    start = "<tool_call>"
    end = "</tool_call>"

    def parse(self, text: str, final: bool = True) -> ParseResult:
        normal: list[str] = []
        calls: list[ToolCall] = []
        pos = 0
        while True:
            idx = text.find(self.start, pos)
            if idx < 0:
                normal.append(text[pos:])
                break
            normal.append(text[pos:idx])
            body_at = idx + len(self.start)
            close = text.find(self.end, body_at)
            if close < 0:
                # Unclosed last call: counts only at the end, and only when its JSON is whole.
                call = self._decode(text[body_at:]) if final else None
                if call is not None:
                    calls.append(call)
                elif final:
                    normal.append(text[idx:])
                break
            call = self._decode(text[body_at:close])
            if call is not None:
                calls.append(call)
            pos = close + len(self.end)
        return ParseResult("".join(normal).strip() if calls else "".join(normal), calls)

    def _decode(self, body: str) -> ToolCall | None:
        decoded = decode_at(body, skip_ws(body, 0))
        if decoded is None:
            return None
        return call_from_object(decoded[0], self.known, _ARG_KEYS)


class Llama3Parser(ToolCallParser):
    """`<|python_tag|>{"name": ..., "parameters": {...}}`, or a bare JSON object opening the
    reply; parallel calls are separated by `;`."""

    name = "llama3"
    start = "<|python_tag|>"

    def find_start(self, text: str, at_start: bool = True) -> int:
        idx = text.find(self.start)
        if idx >= 0:
            return idx
        stripped = text.lstrip()
        if at_start and stripped.startswith("{"):
            return len(text) - len(stripped)
        return -1

    def parse(self, text: str, final: bool = True) -> ParseResult:
        idx = self.find_start(text)
        if idx < 0:
            return ParseResult(text, [])
        normal, body = text[:idx], text[idx:].replace(self.start, "")
        calls: list[ToolCall] = []
        pos = skip_ws(body, 0)
        while pos < len(body):
            decoded = decode_at(body, pos)
            if decoded is None:
                break
            call = call_from_object(decoded[0], self.known, _ARG_KEYS)
            if call is not None:
                calls.append(call)
            pos = skip_ws(body, decoded[1])
            if pos < len(body) and body[pos] == ";":
                pos = skip_ws(body, pos + 1)
        if final and pos < len(body):
            normal += body[pos:]
        return ParseResult(normal, calls)


class MistralParser(ToolCallParser):
    """`[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`, or the newer
    `[TOOL_CALLS]name[ARGS]{...}` (one marker per call)."""

    name = "mistral"
    start = "[TOOL_CALLS]"
    args_marker = "[ARGS]"

    def parse(self, text: str, final: bool = True) -> ParseResult:
        segments = text.split(self.start)
        normal = [segments[0]]
        calls: list[ToolCall] = []
        for seg in segments[1:]:
            rest = self._segment(seg, calls, final)
            if final and rest:
                normal.append(rest)
        return ParseResult("".join(normal).strip() if calls else "".join(normal), calls)

    def _segment(self, seg: str, calls: list[ToolCall], final: bool) -> str:
        pos = skip_ws(seg, 0)
        if seg[pos : pos + 1] == "[":
            scan = scan_array(seg, pos)
            for item in scan.items:
                call = call_from_object(item, self.known, _ARG_KEYS)
                if call is not None:
                    calls.append(call)
            return seg[scan.end :] if scan.end is not None else ("" if scan.items else seg)
        marker = seg.find(self.args_marker)
        if marker < 0:
            return seg
        at = skip_ws(seg, marker + len(self.args_marker))
        decoded = decode_at(seg, at)
        if decoded is None:
            return seg
        call = make_call(seg[:marker].strip(), decoded[0], self.known)
        if call is not None:
            calls.append(call)
        return seg[decoded[1] :]


class JsonArrayParser(ToolCallParser):
    """The forced-choice format (tool_choice "required" or a named function): the grammar makes
    the whole reply `[{"name": ..., "parameters": {...}}, ...]`."""

    name = "json_array"
    start = "["

    def find_start(self, text: str, at_start: bool = True) -> int:
        stripped = text.lstrip()
        return len(text) - len(stripped) if stripped.startswith("[") else -1

    def parse(self, text: str, final: bool = True) -> ParseResult:
        idx = self.find_start(text)
        if idx < 0:
            return ParseResult(text, [])
        scan = scan_array(text, idx)
        calls = [c for c in (call_from_object(i, self.known, _ARG_KEYS) for i in scan.items) if c]
        rest = text[scan.end :] if scan.end is not None else ""
        return ParseResult(rest.strip() if final else "", calls)


__all__ = ["HermesParser", "JsonArrayParser", "Llama3Parser", "MistralParser"]
