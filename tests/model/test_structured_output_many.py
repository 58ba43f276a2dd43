"""Issue-scale check (slow): 50 varied JSON schemas per grammar backend, non-streamed in one batch
with free-text requests, and streamed concurrently; every output parses and validates."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from radixserve import Engine

FIELD_KINDS = ["int", "bool", "enum", "str", "array", "object"]


def field_schema(rng: random.Random, kind: str, depth: int) -> dict[str, Any]:
    if kind == "int":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(1, 100)}
    if kind == "bool":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", "cat", "dog", "yes", "no"], 3)}
    if kind == "str":
        return {"type": "string", "maxLength": rng.randint(3, 12)}
    if kind == "array":
        return {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 9},
            "maxItems": 3,
        }
    if depth > 0:
        return object_schema(rng, depth - 1)
    return {"type": "boolean"}


def object_schema(rng: random.Random, depth: int) -> dict[str, Any]:
    names = rng.sample(
        ["id", "name", "age", "ok", "tags", "color", "size", "meta"], rng.randint(1, 3)
    )
    props = {n: field_schema(rng, rng.choice(FIELD_KINDS), depth) for n in names}
    return {
        "type": "object",
        "properties": props,
        "required": names,
        "additionalProperties": False,
    }


SCHEMAS = [object_schema(random.Random(i), depth=1) for i in range(50)]


def prompt_for(engine: Engine) -> str:
    return engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Answer in JSON."}], add_generation_prompt=True, tokenize=False
    )


def params_for(i: int, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "json_schema": json.dumps(schema),
        "max_new_tokens": 200,
        "temperature": 0.7,
        "sampling_seed": i,
    }


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["xgrammar", "llguidance", "outlines"])
def test_fifty_schemas_stream_and_not(backend: str, default_gguf: Path) -> None:
    with Engine(
        model_path=str(default_gguf),
        dtype="float32",
        grammar_backend=backend,
        max_total_tokens=32768,
        runtime="thread",
        # A 135M model left free to place whitespace inside JSON can loop on it until the
        # token limit; compact JSON keeps every output finishable.
        constrained_json_disable_any_whitespace=True,
    ) as engine:
        prompt = prompt_for(engine)
        prompts = [prompt] * len(SCHEMAS) + ["Once upon a time"] * 4
        params = [params_for(i, s) for i, s in enumerate(SCHEMAS)]
        params += [{"max_new_tokens": 32, "temperature": 0}] * 4
        results = engine.generate(prompts, params)
        for schema, result in zip(SCHEMAS, results, strict=False):
            assert result["meta_info"]["finish_reason"]["type"] == "stop", result["text"]
            jsonschema.validate(json.loads(result["text"]), schema)

        async def stream_one(i: int, schema: dict[str, Any]) -> str:
            chunks = await engine.async_generate(prompt, params_for(i, schema), stream=True)
            return "".join([c["text"] async for c in chunks])

        async def stream_all() -> list[str]:
            return await asyncio.gather(*(stream_one(i, s) for i, s in enumerate(SCHEMAS)))

        for schema, text in zip(SCHEMAS, asyncio.run(stream_all()), strict=True):
            jsonschema.validate(json.loads(text), schema)
