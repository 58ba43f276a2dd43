from __future__ import annotations

import random

import pytest

from radixserve.parsers.reasoning import ReasoningParser, ReasoningSplit


def _stream(name: str, text: str, seed: int, stream_reasoning: bool = True) -> ReasoningSplit:
    rng = random.Random(seed)
    parser = ReasoningParser(name, stream_reasoning)
    reasoning, content, pos = "", "", 0
    while pos < len(text):
        step = rng.randint(1, 5)
        part = parser.feed(text[pos : pos + step])
        reasoning, content, pos = reasoning + part.reasoning, content + part.content, pos + step
    part = parser.flush()
    return ReasoningSplit(reasoning + part.reasoning, content + part.content)


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("deepseek-r1", "<think>plan it</think>\n\nAnswer.", ("plan it", "Answer.")),
        ("deepseek-r1", "plan it</think>Answer.", ("plan it", "Answer.")),
        ("deepseek-r1", "still thinking", ("still thinking", "")),
        ("qwen3", "<think>plan it</think>\n\nAnswer.", ("plan it", "Answer.")),
        ("qwen3", "No thinking here.", ("", "No thinking here.")),
        ("qwen3", "plan it</think>Answer.", ("", "plan it</think>Answer.")),
        ("qwen3-thinking", "plan it</think>Answer.", ("plan it", "Answer.")),
    ],
)
def test_parse_whole_text(name: str, text: str, expected: tuple[str, str]) -> None:
    assert tuple(ReasoningParser(name).parse(text)) == expected


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        (
            "deepseek-r1",
            "<think>plan <b> it</think>\n\nAnswer <x>.",
            ("plan <b> it", "Answer <x>."),
        ),
        ("deepseek-r1", "plan it</think>Answer.", ("plan it", "Answer.")),
        ("qwen3", "<think>a < b</think>Answer.", ("a < b", "Answer.")),
        ("qwen3", "Plain <thin answer.", ("", "Plain <thin answer.")),
        ("deepseek-r1", "never ends </thi", ("never ends </thi", "")),
    ],
)
def test_streamed_in_random_chunks(
    name: str, text: str, expected: tuple[str, str], seed: int
) -> None:
    assert tuple(_stream(name, text, seed)) == expected


def test_stream_reasoning_false_sends_reasoning_in_one_piece() -> None:
    parser = ReasoningParser("deepseek-r1", stream_reasoning=False)
    assert parser.feed("<think>abc") == ("", "")
    assert parser.feed("def</think>ok") == ("abcdef", "ok")


def test_unknown_parser_names_the_option() -> None:
    with pytest.raises(ValueError, match="reasoning_parser"):
        ReasoningParser("nope")
