"""JSON whitespace is bounded by default (issue 11), on the default model's tokenizer: one space
or a newline with indentation passes, a long run does not; SGLang's two options still choose."""

from __future__ import annotations

import json
from typing import Any

import pytest

from radixserve.sampling.constrained import (
    GrammarSpec,
    available_grammar_backends,
    create_grammar_backend,
)
from tests.unit.test_grammar_backends import VOCAB_SIZE, tokenizer_fixture  # noqa: F401

SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
PRETTY = '{\n  "a": 1\n}'
COMPACT = '{"a":1}'
SPACED = '{"a": 1}'
LONG_RUN = "{" + " " * 30 + '"a": 1}'
NEWLINES = "{" + "\n" * 30 + '"a": 1}'


def accepts(backend: Any, tokenizer: Any, text: str, spec: GrammarSpec | None = None) -> bool:
    matcher = backend.matcher(backend.compile(spec or GrammarSpec("json_schema", SCHEMA)))
    return all(matcher.accept_token(i) for i in tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("name", available_grammar_backends())
def test_default_json_whitespace_is_bounded(name: str, tokenizer: Any) -> None:
    backend = create_grammar_backend(name, tokenizer, VOCAB_SIZE)
    assert accepts(backend, tokenizer, COMPACT) and accepts(backend, tokenizer, SPACED)
    assert not accepts(backend, tokenizer, LONG_RUN)
    assert not accepts(backend, tokenizer, NEWLINES)
    if name != "outlines":  # outlines keeps its own `[ ]?`: no newlines at all
        assert accepts(backend, tokenizer, PRETTY)
    # Any JSON (json_object) is bounded too.
    assert not accepts(backend, tokenizer, LONG_RUN, GrammarSpec("json_object"))


@pytest.mark.parametrize("name", [n for n in available_grammar_backends() if n != "outlines"])
def test_disable_any_whitespace_is_compact(name: str, tokenizer: Any) -> None:
    backend = create_grammar_backend(name, tokenizer, VOCAB_SIZE, any_whitespace=False)
    assert not accepts(backend, tokenizer, PRETTY)
    assert not accepts(backend, tokenizer, LONG_RUN)


@pytest.mark.parametrize("name", [n for n in available_grammar_backends() if n != "xgrammar"])
def test_a_whitespace_pattern_chooses(name: str, tokenizer: Any) -> None:
    backend = create_grammar_backend(name, tokenizer, VOCAB_SIZE, whitespace_pattern=r"[ \t\n\r]*")
    assert accepts(backend, tokenizer, LONG_RUN) and accepts(backend, tokenizer, NEWLINES)


BLANK_LINES = ['{"a"\n  \n\n\n\n: 1}', '{\n\n  "a": 1\n}', '{"a":\n\n1}']
NESTED_PRETTY = json.dumps({"a": 1, "b": {"c": [1, 2], "d": "x"}}, indent=2)


@pytest.mark.parametrize("name", [n for n in available_grammar_backends() if n != "outlines"])
@pytest.mark.parametrize(
    "spec",
    [
        GrammarSpec("json_schema", SCHEMA),
        GrammarSpec("json_object"),
        GrammarSpec("json_schema", "$$ANY$$"),
    ],
    ids=["json_schema", "json_object", "any_json"],
)
def test_no_blank_lines_in_any_json_mode(name: str, spec: GrammarSpec, tokenizer: Any) -> None:
    """Issue 31: xgrammar's count bound still let json_object emit runs of blank lines; every
    gap is now one space/tab or one newline with indentation, on every backend and mode."""
    backend = create_grammar_backend(name, tokenizer, VOCAB_SIZE)
    for text in BLANK_LINES:
        assert not accepts(backend, tokenizer, text, spec), (name, text)
    assert accepts(backend, tokenizer, PRETTY, spec)
    if spec.kind == "json_object" or spec.is_any_json:
        assert accepts(backend, tokenizer, NESTED_PRETTY, spec)


def test_xgrammar_grammar_is_rewritten_not_left_on_its_count() -> None:
    """The rewrite depends on xgrammar's EBNF shape: fail here, not silently, if it changes."""
    xgr = pytest.importorskip("xgrammar")
    from radixserve.sampling.constrained.xgrammar_backend import bounded_gaps

    grammar = xgr.Grammar.from_json_schema(SCHEMA, any_whitespace=True, max_whitespace_cnt=21)
    assert bounded_gaps(grammar) is not None
