"""Hypothesis fuzz of the real grammar compilers (default run; the slow schemathesis run in
tests/e2e/test_http_e2e_schema_fuzz.py sends them only what the OpenAPI strategies make):
random JSON schemas, regexes and EBNF grammars, valid and not, given to every installed
backend on the default model's tokenizer. Each must compile or raise GrammarError (the 400
the server answers): no other exception, no crash, and a compiled grammar must give a
matcher whose first mask allows at least one token."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixserve.sampling.constrained import GrammarBackend, GrammarError, GrammarSpec
from radixserve.sampling.constrained.bitmask import allocate_bitmask
from tests.unit.test_grammar_backends import (  # noqa: F401 (fixtures)
    backend_fixture,
    one_torch_thread_fixture,
    tokenizer_fixture,
)

EXAMPLES = 25
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)

_SCALARS = st.sampled_from(["string", "integer", "number", "boolean", "null", "object", "bogus"])
_KEYWORD_VALUES = st.one_of(
    st.integers(-3, 40), st.booleans(), st.text(max_size=6), st.just("^[a-z]{1,3}$")
)
_KEYWORDS = st.sampled_from(
    ["minLength", "maxLength", "minimum", "maximum", "pattern", "format", "enum", "const",
     "minItems", "maxItems", "required", "additionalProperties", "$ref", "multipleOf"]
)  # fmt: skip
_LEAF = st.one_of(
    st.fixed_dictionaries({"type": _SCALARS}, optional={"maxLength": st.integers(-1, 8)}),
    st.dictionaries(_KEYWORDS, _KEYWORD_VALUES, max_size=3),
    st.booleans(),
)
SCHEMAS = st.recursive(
    _LEAF,
    lambda inner: st.one_of(
        st.fixed_dictionaries(
            {
                "type": st.just("object"),
                "properties": st.dictionaries(st.text(max_size=5), inner, max_size=3),
            },
            optional={"required": st.lists(st.text(max_size=5), max_size=2)},
        ),
        st.fixed_dictionaries({"type": st.just("array"), "items": inner}),
        st.fixed_dictionaries({"anyOf": st.lists(inner, min_size=1, max_size=3)}),
        st.lists(inner, max_size=2),  # not a schema at all
    ),
    max_leaves=6,
)
_REGEX_PIECES = st.sampled_from(
    ["a", "b+", "[0-9]{2,3}", "(x|y)", "\\d", ".", "*", "(", ")", "[", "]", "{3}", "?", "\\", "^",
     "$", "[^a]", "(?:z)", "\\w+", "{,}", "|"]
)  # fmt: skip
REGEXES = st.one_of(st.lists(_REGEX_PIECES, max_size=8).map("".join), st.text(max_size=12))
_EBNF_PIECES = st.sampled_from(
    ['root ::= "a"', "root ::= x", ' x ::= "b"+', " | ", '"c"', "(", ")", "*", "::=", "root",
     "\n", '[a-z]', " x", ' "quote']
)  # fmt: skip
EBNFS = st.one_of(st.lists(_EBNF_PIECES, max_size=6).map("".join), st.text(max_size=12))


def _compiles_or_refuses(backend: GrammarBackend, spec: GrammarSpec) -> None:
    try:
        compiled = backend.compile(spec)
    except GrammarError as exc:
        assert str(exc), spec  # the 400's message
        return
    matcher = backend.matcher(compiled)
    bitmask = allocate_bitmask(1, backend.vocab_size)
    matcher.fill_packed(bitmask, 0)
    assert bool(bitmask.any()), f"{spec} compiled to a grammar that allows nothing"


def test_random_json_schemas(backend: GrammarBackend) -> None:
    @FUZZ
    @given(schema=SCHEMAS)
    def fuzz(schema: Any) -> None:
        _compiles_or_refuses(backend, GrammarSpec("json_schema", json.dumps(schema)))

    fuzz()


def test_random_regexes(backend: GrammarBackend) -> None:
    @FUZZ
    @given(pattern=REGEXES)
    def fuzz(pattern: str) -> None:
        _compiles_or_refuses(backend, GrammarSpec("regex", pattern))

    fuzz()


def test_random_ebnf(backend: GrammarBackend) -> None:
    if backend.name == "outlines":
        pytest.skip("the outlines backend takes no EBNF (refused up front)")

    @FUZZ
    @given(grammar=EBNFS)
    def fuzz(grammar: str) -> None:
        _compiles_or_refuses(backend, GrammarSpec("ebnf", grammar))

    fuzz()
