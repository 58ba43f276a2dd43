"""The pythonic format: `[get_weather(city="Paris"), get_time(zone="CET")]` (Llama 3.2/4)."""

from __future__ import annotations

import ast
import json
import logging
import re
from typing import Any

from radixserve.parsers.tool_calls.base import ParseResult, ToolCall, ToolCallParser, make_call

logger = logging.getLogger(__name__)

_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
# A tail that may still grow into a start: "[", "[ get", "[get_wea".
_MAYBE_START = re.compile(r"\[\s*[A-Za-z_]?[\w.]*\s*$")
_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


def _literal(node: ast.expr) -> Any:
    # JSON spellings (true/false/null) are accepted as well as Python's.
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, ast.List):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True)}
    return ast.literal_eval(node)


def _call_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        base = _call_name(func.value)
        return f"{base}.{func.attr}" if base else None
    return None


class PythonicParser(ToolCallParser):
    """A Python list of calls with keyword arguments; emitted when the list closes."""

    name = "pythonic"
    start = "["

    def find_start(self, text: str, at_start: bool = True) -> int:
        match = _START.search(text)
        return match.start() if match else -1

    def hold_len(self, text: str) -> int:
        idx = text.rfind("[")
        if idx >= 0 and _MAYBE_START.fullmatch(text[idx:]):
            return len(text) - idx
        return 0

    def parse(self, text: str, final: bool = True) -> ParseResult:
        idx = self.find_start(text)
        if idx < 0:
            return ParseResult(text, [])
        pos = text.find("]", idx)
        while pos >= 0:
            calls = self._try_list(text[idx : pos + 1])
            if calls is not None:
                normal = (text[:idx] + text[pos + 1 :]).strip()
                return ParseResult(normal, calls)
            pos = text.find("]", pos + 1)
        return ParseResult(text if final else "", [])

    def _try_list(self, source: str) -> list[ToolCall] | None:
        try:
            tree = ast.parse(source, mode="eval")
        except SyntaxError:
            return None
        body = tree.body
        if not isinstance(body, ast.List) or not all(isinstance(e, ast.Call) for e in body.elts):
            return None
        calls: list[ToolCall] = []
        for node in body.elts:
            assert isinstance(node, ast.Call)
            try:
                args = {kw.arg: _literal(kw.value) for kw in node.keywords if kw.arg}
            except (ValueError, TypeError, SyntaxError):
                logger.warning("Pythonic tool call with non-literal arguments; dropped.")
                continue
            call = make_call(_call_name(node.func), json.loads(json.dumps(args)), self.known)
            if call is not None:
                calls.append(call)
        return calls
