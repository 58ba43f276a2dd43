"""OpenAI's harmony format (gpt-oss): the special-token markers and message-header parsing that
the `gpt-oss` reasoning and tool-call parsers share.

A reply is a run of messages, each `[<|start|>role] <|channel|>NAME [to=RECIPIENT]
[<|constrain|>json] <|message|>BODY <|end|> | <|call|> | <|return|>`. The prompt ends with
`<|start|>assistant`, so the first message of a reply has no `<|start|>`. The recipient may also
sit in the role part (`<|start|>assistant to=functions.f<|channel|>commentary json`).
"""

from __future__ import annotations

import re
from typing import NamedTuple

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
CONSTRAIN = "<|constrain|>"
END = "<|end|>"
CALL = "<|call|>"
RETURN = "<|return|>"

# What opens a message header, and what ends a message body. A header or a new message
# opening also ends a body: a model that forgets `<|end|>` loses no text.
OPENERS = (START, CHANNEL)
BODY_ENDS = (END, CALL, RETURN, START, CHANNEL)
MARKERS = (START, CHANNEL, MESSAGE, CONSTRAIN, END, CALL, RETURN)

_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL_NAME = re.compile(r"<\|channel\|>\s*([^\s<]+)")

FUNCTIONS_PREFIX = "functions."


class Header(NamedTuple):
    channel: str | None  # "analysis", "commentary", "final", or None when absent
    recipient: str | None  # "functions.NAME" for a tool call


def parse_header(header: str) -> Header:
    """The channel and recipient of a header (the raw text before `<|message|>`).

    The last channel counts and `to=assistant` is no recipient: gpt-oss-20b sometimes prefixes
    a header with a stray `<|channel|>commentary to=assistant` (llama.cpp's parser notes it).
    """
    channels = _CHANNEL_NAME.findall(header)
    recipients = [r for r in _RECIPIENT.findall(header) if r != "assistant"]
    return Header(channels[-1] if channels else None, recipients[-1] if recipients else None)


def first_of(text: str, markers: tuple[str, ...], pos: int = 0) -> tuple[int, str]:
    """The earliest of `markers` in `text` from `pos`: (index, marker), or (-1, "")."""
    best, which = -1, ""
    for marker in markers:
        idx = text.find(marker, pos)
        if idx >= 0 and (best < 0 or idx < best):
            best, which = idx, marker
    return best, which


def hold_len(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of one of `markers`."""
    best = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:size]):
                best = size
                break
    return best
