"""Matcher behaviour and compilation for each installed grammar backend, on the default
model's real tokenizer: rollback, independence, refusals, the compile cache, invalid grammars,
the compile deadline and compact JSON. The fixtures and the random walk live in
test_grammar_backends."""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import pytest
import torch

from radixserve.sampling.constrained import (
    GrammarBackend,
    GrammarError,
    GrammarSpec,
    create_grammar_backend,
)
from tests.unit.test_grammar_backends import (  # noqa: F401 (fixtures are found by name)
    REGEXES,
    SCHEMAS,
    VOCAB_SIZE,
    Tokens,
    _feed,
    _matcher,
    backend_fixture,
    jsonschema,
    one_torch_thread_fixture,
    tok_fixture,
    tokenizer_fixture,
    walk,
)


def test_compact_json_without_any_whitespace(
    backend: GrammarBackend, tokenizer: Any, tok: Tokens
) -> None:
    """any_whitespace=False: at most one space, and only after "," or ":" (xgrammar's compact
    form is json.dumps' ", " / ": "; llguidance and outlines emit none)."""
    compact = create_grammar_backend(backend.name, tokenizer, VOCAB_SIZE, any_whitespace=False)
    assert compact is not None
    schema = SCHEMAS["array_of_objects"]
    compiled = compact.compile(GrammarSpec("json_schema", json.dumps(schema)))
    for seed in range(2):
        text = tok.decode(walk(compact.matcher(compiled), tok, seed))
        jsonschema.validate(json.loads(text), schema)
        outside_strings = re.sub(r'"(\\.|[^"\\])*"', '""', text)
        assert not re.search(r"\s", outside_strings.replace(", ", ",").replace(": ", ":")), text


# --- matcher behaviour -------------------------------------------------------------------------


def test_rollback_restores_the_mask_and_the_walk_still_validates(
    backend: GrammarBackend, tok: Tokens
) -> None:
    schema = SCHEMAS["nested_objects"]
    compiled = backend.compile(GrammarSpec("json_schema", json.dumps(schema)))
    reference = walk(backend.matcher(compiled), tok, seed=7)
    matcher = backend.matcher(compiled)
    masks = []
    allowed = torch.zeros(VOCAB_SIZE, dtype=torch.bool)
    for token in reference:
        matcher.fill_bitmask(allowed)
        masks.append(allowed.clone())
        assert matcher.accept_token(token)
    assert matcher.accept_token(tok.eos) and matcher.is_terminated()
    matcher.fill_bitmask(allowed)
    assert allowed.nonzero().flatten().tolist() == [tok.eos]
    assert not matcher.accept_token(reference[0])
    # Undo EOS plus three tokens: the mask is the one seen before the third-last token.
    matcher.rollback(4)
    assert not matcher.is_terminated()
    matcher.fill_bitmask(allowed)
    assert torch.equal(allowed, masks[-3])
    for token in reference[-3:]:
        assert matcher.accept_token(token)
    assert matcher.accept_token(tok.eos)
    with pytest.raises(ValueError, match="num_tokens"):
        matcher.rollback(len(reference) + 2)


def test_matchers_are_independent(backend: GrammarBackend, tok: Tokens) -> None:
    compiled = backend.compile(GrammarSpec("regex", REGEXES["date"]))
    first, second = backend.matcher(compiled), backend.matcher(compiled)
    before = torch.zeros(VOCAB_SIZE, dtype=torch.bool)
    second.fill_bitmask(before)
    assert _feed(first, tok, "2024-")
    after = torch.zeros(VOCAB_SIZE, dtype=torch.bool)
    second.fill_bitmask(after)
    assert torch.equal(before, after)
    assert _feed(second, tok, "1999-12-31") and second.accept_token(tok.eos)
    assert not first.is_terminated()


def test_accept_token_refuses_disallowed_and_out_of_range_ids(
    backend: GrammarBackend, tok: Tokens
) -> None:
    matcher = _matcher(backend, "regex", REGEXES["hex"])
    letter = tok.tokenizer.encode("z", add_special_tokens=False)[0]
    assert not matcher.accept_token(letter)
    assert not matcher.accept_token(tok.eos)  # nothing matched yet
    assert not matcher.accept_token(VOCAB_SIZE - 1)  # a padding id
    assert not matcher.accept_token(VOCAB_SIZE + 5)
    assert not matcher.accept_token(-1)
    # A refused token leaves the state as it was.
    assert _feed(matcher, tok, "0xff") and matcher.accept_token(tok.eos)


def test_a_dead_end_allows_nothing_and_rollback_leaves_it(
    backend: GrammarBackend, tok: Tokens
) -> None:
    """After "a", the regex needs \x06, which no token holds: the mask allows nothing (no
    exception, which would fail the whole batch's step) and every token is refused; rolling
    back (as a speculative verify does after probing ahead) restores the live state."""
    if backend.name == "outlines":
        pytest.skip("outlines refuses this regex at compile time (vocabulary check)")
    matcher = _matcher(backend, "regex", "a\x06")
    allowed = torch.zeros(VOCAB_SIZE, dtype=torch.bool)
    matcher.fill_bitmask(allowed)
    start = allowed.clone()
    a = tok.tokenizer.encode("a", add_special_tokens=False)[0]
    assert bool(start[a]) and matcher.accept_token(a)
    matcher.fill_bitmask(allowed)
    assert not bool(allowed.any())
    assert not matcher.accept_token(a) and not matcher.accept_token(tok.eos)
    matcher.rollback(1)
    matcher.fill_bitmask(allowed)
    assert torch.equal(allowed, start)
    assert matcher.accept_token(a)


# --- compile: cache, errors, deadline ----------------------------------------------------------


def test_compile_cache_returns_the_same_object(backend: GrammarBackend) -> None:
    spec = GrammarSpec("json_schema", json.dumps(SCHEMAS["enums"]))
    first = backend.compile(spec)
    assert backend.compile(GrammarSpec("json_schema", json.dumps(SCHEMAS["enums"]))) is first


INVALID = [
    ("regex", "(ab"),
    ("regex", "[z-a]"),
    ("json_schema", "{bad json"),
    ("json_schema", '{"type": "no-such-type"}'),
    ("json_schema", "[1, 2]"),
    ("ebnf", "root ::= undefined_rule"),
    ("ebnf", 'root ::= "unterminated'),
    ("structural_tag", "not json"),
]


@pytest.mark.parametrize("kind,value", INVALID)
def test_invalid_grammar_raises_grammar_error_naming_the_param(
    backend: GrammarBackend, kind: str, value: str
) -> None:
    with pytest.raises(GrammarError) as info:
        backend.compile(GrammarSpec(kind, value))
    assert info.value.param == kind
    assert str(info.value)


def test_slow_compile_is_refused_and_others_still_compile(
    backend: GrammarBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    real_compile = backend._compile

    def slow_compile(spec: GrammarSpec) -> object:
        if spec.value == "[0-9]{3}":
            release.wait(10)
        return real_compile(spec)

    monkeypatch.setattr(backend, "_compile", slow_compile)
    monkeypatch.setattr(backend, "compile_timeout_s", 0.3)
    try:
        with pytest.raises(GrammarError, match="took too long to compile") as info:
            backend.compile(GrammarSpec("regex", "[0-9]{3}"))
        assert info.value.param == "regex"
        # The stuck compile does not hold up another grammar.
        assert backend.compile(GrammarSpec("regex", "[a-c]{2}")) is not None
    finally:
        release.set()
