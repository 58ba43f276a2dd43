"""Grammar-constrained decoding on the real default model: outputs parse and validate, for each
grammar backend, while unconstrained requests share the batch; bad grammars are refused."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from radixserve import Engine

SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 16},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
            "ok": {"type": "boolean"},
        },
        "required": ["colors", "ok"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "point": {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                "required": ["x", "y"],
            }
        },
        "required": ["point"],
        "additionalProperties": False,
    },
]
REGEXES = {
    "date": r"\d{4}-\d{2}-\d{2}",
    "hex": r"0x[0-9a-f]{4,8}",
    "email": r"[a-z]{3,8}@[a-z]{3,8}\.(com|org)",
    "phone": r"\(\d{3}\) \d{3}-\d{4}",
}
# An EBNF grammar and a regex that accepts exactly its language.
EBNF = 'root ::= greeting " " name "!"\ngreeting ::= "Hello" | "Hi"\nname ::= "Alice" | "Bob" | "Carol"'
EBNF_LANGUAGE = r"(Hello|Hi) (Alice|Bob|Carol)!"


# The default run checks the default backend on the real model; the other two backends run on
# the real tokenizer in tests/unit/test_grammar_backends.py, and here when slow tests run.
@pytest.fixture(
    scope="module",
    params=[
        "xgrammar",
        pytest.param("llguidance", marks=pytest.mark.slow),
        pytest.param("outlines", marks=pytest.mark.slow),
    ],
)
def engine(request: pytest.FixtureRequest, default_gguf: Path) -> Iterator[Engine]:
    with Engine(
        model_path=str(default_gguf),
        dtype="float32",
        max_total_tokens=8192,
        grammar_backend=request.param,
        runtime="thread",
    ) as eng:
        yield eng


def chat(engine: Engine, text: str) -> str:
    return engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )


def test_json_schemas_and_regexes_alongside_free_text(engine: Engine) -> None:
    prompts, params = [], []
    for schema in SCHEMAS:
        prompts.append(chat(engine, "Reply with JSON describing something."))
        params.append(
            {
                "json_schema": json.dumps(schema),
                "max_new_tokens": 160,
                "temperature": 0.7,
                "sampling_seed": 1,
            }
        )
    for regex in REGEXES.values():
        prompts.append(chat(engine, "Give me an example value."))
        params.append(
            {"regex": regex, "max_new_tokens": 32, "temperature": 0.7, "sampling_seed": 2}
        )
    prompts.append("Once upon a time")
    params.append({"max_new_tokens": 16, "temperature": 0})
    ebnf = engine.server_args.grammar_backend != "outlines"  # outlines has no EBNF (as SGLang)
    if ebnf:
        prompts.append(chat(engine, "Greet someone."))
        params.append({"ebnf": EBNF, "max_new_tokens": 16, "temperature": 0.7, "sampling_seed": 3})
    results = engine.generate(prompts, params)
    for schema, result in zip(SCHEMAS, results, strict=False):
        assert result["meta_info"]["finish_reason"]["type"] == "stop", result
        jsonschema.validate(json.loads(result["text"]), schema)
    for regex, result in zip(REGEXES.values(), results[len(SCHEMAS) :], strict=False):
        assert re.fullmatch(regex, result["text"]), (regex, result["text"])
    free = results[len(SCHEMAS) + len(REGEXES)]
    assert len(free["output_ids"]) == 16
    if ebnf:
        assert re.fullmatch(EBNF_LANGUAGE, results[-1]["text"]), results[-1]["text"]
    info = engine.get_server_info()
    assert info["available_kv_tokens"] + info["cached_tokens"] == info["max_total_num_tokens"]


def test_invalid_grammars_are_refused_and_the_engine_serves_on(engine: Engine) -> None:
    with pytest.raises(ValueError) as err:
        engine.generate("x", {"regex": "([a-z"})
    assert getattr(err.value, "param", None) == "regex"
    with pytest.raises(ValueError) as err:
        engine.generate("x", {"json_schema": "{not json"})
    assert getattr(err.value, "param", None) == "json_schema"
    ok = engine.generate("Hello", {"max_new_tokens": 4, "temperature": 0})
    assert len(ok["output_ids"]) == 4


def test_grammars_the_vocabulary_cannot_follow_are_client_errors(engine: Engine) -> None:
    # No token contains the control character \x06: refused before it runs, naming the field
    # (each backend words it its own way).
    with pytest.raises(ValueError) as err:
        engine.generate("x", {"regex": "\x06"})
    assert getattr(err.value, "param", None) == "regex"
    # "a" then \x06: a dead end after one token (outlines sees it at compile time). The
    # request ends as the client's error (400, not an internal 500), keeps only tokens the
    # grammar accepted, and its neighbour in the batch finishes.
    dead_end = {"regex": "a\x06", "max_new_tokens": 8, "temperature": 0}
    if engine.server_args.grammar_backend == "outlines":
        with pytest.raises(ValueError):
            engine.generate("Say a", dead_end)
        return
    results = engine.generate(["Say a", "Hello"], [dead_end, {"max_new_tokens": 4}])
    dead = results[0]["meta_info"]["finish_reason"]
    assert dead["type"] == "abort" and dead["status_code"] == 400, dead
    assert "no further token" in dead["message"]
    assert results[0]["text"] == "a"
    assert len(results[1]["output_ids"]) == 4
    info = engine.get_server_info()
    assert info["available_kv_tokens"] + info["cached_tokens"] == info["max_total_num_tokens"]


def test_json_whitespace_is_bounded_so_the_json_completes(engine: Engine) -> None:
    """With "any whitespace" JSON this greedy request emitted 120 newlines and ran out of
    tokens (issue 11); by default whitespace between JSON tokens is bounded."""
    schema = SCHEMAS[1]
    prompt = chat(engine, "Give me a JSON example.")
    params = [
        {"json_schema": json.dumps(schema), "max_new_tokens": 160, "temperature": 0},
        *(
            {
                "json_schema": json.dumps(schema),
                "max_new_tokens": 160,
                "temperature": 1.0,
                "sampling_seed": seed,
            }
            for seed in (3, 4, 5)
        ),
    ]
    for result in engine.generate([prompt] * len(params), params):
        text = result["text"]
        assert result["meta_info"]["finish_reason"]["type"] == "stop", text
        jsonschema.validate(json.loads(text), schema)
        longest = max((len(run) for run in re.findall(r"\s+", text)), default=0)
        assert longest <= 21, repr(text)
