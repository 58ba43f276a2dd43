"""The outlines backend's schema-to-regex additions: integer ranges and any-JSON (no
tokenizer; needs outlines-core)."""

from __future__ import annotations

import json
import random
import re

import pytest

pytest.importorskip("outlines_core")

from radixserve.sampling.constrained.outlines_schema import (
    EmptyRangeError,
    any_json_regex,
    integer_range_regex,
    schema_to_regex,
)

RANGES = [
    (0, 0),
    (0, 9),
    (1, 10),
    (18, 99),
    (7, 1234),
    (100, 999),
    (105, 2990),
    (-5, 5),
    (-120, -7),
    (-1000, 0),
    (0, None),
    (37, None),
    (None, -3),
    (None, 42),
    (None, None),
]


@pytest.mark.parametrize("lo,hi", RANGES)
def test_integer_range_regex_matches_exactly_the_range(lo: int | None, hi: int | None) -> None:
    pattern = re.compile(integer_range_regex(lo, hi))
    for n in range(-1300, 3100):
        inside = (lo is None or n >= lo) and (hi is None or n <= hi)
        assert bool(pattern.fullmatch(str(n))) == inside, (lo, hi, n)
    # Never a leading zero or a negative zero, which JSON forbids.
    for text in ("01", "-0", "007", "-01"):
        assert not pattern.fullmatch(text), (lo, hi, text)


def test_integer_range_regex_on_random_wide_ranges() -> None:
    rng = random.Random(0)
    for _ in range(30):
        lo = rng.randint(-(10**6), 10**6)
        hi = lo + rng.randint(0, 10**6)
        pattern = re.compile(integer_range_regex(lo, hi))
        for n in [
            lo - 1,
            lo,
            hi,
            hi + 1,
            *(rng.randint(lo - 10**5, hi + 10**5) for _ in range(200)),
        ]:
            assert bool(pattern.fullmatch(str(n))) == (lo <= n <= hi), (lo, hi, n)


def test_schema_to_regex_enforces_integer_bounds_everywhere() -> None:
    schema = {
        "type": "object",
        "properties": {
            "age": {"type": "integer", "minimum": 18, "maximum": 99},
            "odd": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 3.5},
            "list": {"type": "array", "items": {"type": "integer", "maximum": -1}},
            "free": {"type": "integer"},
        },
        "required": ["age", "odd", "list", "free"],
    }
    pattern = re.compile(schema_to_regex(json.dumps(schema), ""))
    assert pattern.fullmatch('{"age":18,"odd":3,"list":[-1,-50],"free":-7}')
    assert not pattern.fullmatch('{"age":17,"odd":3,"list":[],"free":1}')
    assert not pattern.fullmatch('{"age":100,"odd":3,"list":[],"free":1}')
    assert not pattern.fullmatch('{"age":20,"odd":0,"list":[],"free":1}')
    assert not pattern.fullmatch('{"age":20,"odd":4,"list":[],"free":1}')
    assert not pattern.fullmatch('{"age":20,"odd":1,"list":[0],"free":1}')


def test_schema_to_regex_refuses_an_empty_range() -> None:
    with pytest.raises(EmptyRangeError):
        schema_to_regex(json.dumps({"type": "integer", "minimum": 5, "maximum": 4}), None)


def test_enum_values_are_left_alone() -> None:
    schema = {"enum": [{"type": "integer", "minimum": 1}]}
    assert "RSVBOUNDEDINT" not in schema_to_regex(json.dumps(schema), None)


@pytest.mark.parametrize(
    "text,is_object",
    [
        ('{"a":1,"b":[true,null,"x"],"c":{"d":-2.5e+3}}', True),
        ("{}", True),
        ("[1,2]", False),
        ('"x"', False),
        ("3", False),
    ],
)
def test_any_json_regex(text: str, is_object: bool) -> None:
    assert re.fullmatch(any_json_regex("", object_only=False), text)
    assert bool(re.fullmatch(any_json_regex("", object_only=True), text)) == is_object
    json.loads(text)
    assert not re.fullmatch(any_json_regex("", object_only=False), '{"a":1,}')
