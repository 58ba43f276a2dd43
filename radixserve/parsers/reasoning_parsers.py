"""`--reasoning-parser` name -> the splitter for one request: the `<think>` formats or harmony."""

from __future__ import annotations

from radixserve.parsers.harmony_reasoning import HarmonyReasoningParser
from radixserve.parsers.reasoning import FORMATS, ReasoningParser

HARMONY = "gpt-oss"
REASONING_PARSERS: tuple[str, ...] = (*sorted(FORMATS), HARMONY)

AnyReasoningParser = ReasoningParser | HarmonyReasoningParser


def make_reasoning_parser(
    name: str | None, stream_reasoning: bool = True
) -> AnyReasoningParser | None:
    """The parser named by `--reasoning-parser`; ValueError naming the option when unknown."""
    if name is None:
        return None
    if name == HARMONY:
        return HarmonyReasoningParser(stream_reasoning)
    if name not in FORMATS:
        raise ValueError(
            f"reasoning_parser {name!r} is not supported; expected one of {list(REASONING_PARSERS)}"
        )
    return ReasoningParser(name, stream_reasoning)
