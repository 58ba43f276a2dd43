from __future__ import annotations

import json
import math

import pytest

from radixserve.sampling.sampling_params import (
    MAX_N,
    MAX_STOP_ENTRIES,
    SamplingParams,
    SamplingParamsError,
)

VOCAB = 100


def _error(fn, *args) -> SamplingParamsError:
    with pytest.raises(SamplingParamsError) as info:
        fn(*args)
    return info.value


def test_defaults_match_sglang() -> None:
    p = SamplingParams.from_dict(None)
    assert p.max_new_tokens == 128
    assert p.min_new_tokens == 0
    assert (p.temperature, p.top_p, p.top_k, p.min_p) == (1.0, 1.0, -1, 0.0)
    assert (p.frequency_penalty, p.presence_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert p.stop == [] and p.stop_token_ids is None and p.stop_regex == []
    assert (p.ignore_eos, p.skip_special_tokens, p.spaces_between_special_tokens) == (
        False,
        True,
        True,
    )
    assert p.n == 1 and p.sampling_seed is None and p.logit_bias is None
    assert not p.is_greedy
    p.verify(VOCAB)


def test_none_values_mean_default_except_max_new_tokens() -> None:
    p = SamplingParams.from_dict({"temperature": None, "top_k": None, "stop": None, "n": None})
    assert (p.temperature, p.top_k, p.stop, p.n) == (1.0, -1, [], 1)
    # max_new_tokens is Optional in SGLang: an explicit null means "no limit".
    assert SamplingParams.from_dict({"max_new_tokens": None}).max_new_tokens is None


def test_unknown_key_names_the_key() -> None:
    err = _error(SamplingParams.from_dict, {"temprature": 0.5})
    assert err.param == "temprature"
    assert "temprature" in str(err)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("temperature", "hot"),
        ("temperature", True),
        ("top_p", [0.5]),
        ("max_new_tokens", 1.5),
        ("max_new_tokens", True),
        ("max_new_tokens", "12"),
        ("top_k", 2.0),
        ("n", False),
        ("ignore_eos", 1),
        ("skip_special_tokens", "yes"),
        ("stop", 5),
        ("stop", ["ok", 3]),
        ("stop_regex", {"a": 1}),
        ("stop_token_ids", [1, "2"]),
        ("stop_token_ids", [True]),
        ("stop_token_ids", 7),
        ("stop_token_ids", [-1]),
        ("logit_bias", [1, 2]),
        ("logit_bias", {"1": "big"}),
        ("json_schema", {"type": "object"}),
        ("custom_params", "x"),
        ("sampling_seed", 1.0),
        ("stream_interval", "1"),
    ],
)
def test_type_errors_name_the_param(key: str, value: object) -> None:
    err = _error(SamplingParams.from_dict, {key: value})
    assert err.param == key
    assert key in str(err)


@pytest.mark.parametrize("key", ["abc", "1.5", "", "0x10", "tok"])
def test_bad_logit_bias_key(key: str) -> None:
    err = _error(SamplingParams.from_dict, {"logit_bias": {key: 1.0}})
    assert err.param == "logit_bias"


def test_logit_bias_string_keys_become_ints() -> None:
    p = SamplingParams.from_dict({"logit_bias": {"5": 2, "17": -1.5}})
    assert p.logit_bias == {5: 2.0, 17: -1.5}
    assert all(isinstance(k, int) for k in p.logit_bias)


def test_seed_alias_and_conflict() -> None:
    assert SamplingParams.from_dict({"seed": 42}).sampling_seed == 42
    assert SamplingParams.from_dict({"sampling_seed": 7}).sampling_seed == 7
    assert SamplingParams.from_dict({"seed": 3, "sampling_seed": 3}).sampling_seed == 3
    err = _error(SamplingParams.from_dict, {"seed": 3, "sampling_seed": 4})
    assert err.param in ("seed", "sampling_seed")


def test_stop_normalisation() -> None:
    p = SamplingParams.from_dict(
        {"stop": "END", "stop_regex": r"\d+", "stop_token_ids": [3, None, 3, 9]}
    )
    assert p.stop == ["END"]
    assert p.stop_regex == [r"\d+"]
    assert p.stop_token_ids == {3, 9}
    assert SamplingParams.from_dict({"stop_token_ids": []}).stop_token_ids is None


def test_invalid_stop_regex() -> None:
    assert _error(SamplingParams.from_dict, {"stop_regex": "(unclosed"}).param == "stop_regex"


@pytest.mark.parametrize(
    ("overrides", "param"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": -0.01}, "min_p"),
        ({"min_p": 1.5}, "min_p"),
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"frequency_penalty": -2.01}, "frequency_penalty"),
        ({"presence_penalty": -3.0}, "presence_penalty"),
        ({"presence_penalty": 2.01}, "presence_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": 2.5}, "repetition_penalty"),
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"min_new_tokens": -1}, "min_new_tokens"),
        ({"min_new_tokens": 10, "max_new_tokens": 5}, "min_new_tokens"),
        ({"n": 0}, "n"),
        ({"n": MAX_N + 1}, "n"),
        ({"stream_interval": 0}, "stream_interval"),
        ({"sampling_seed": 1 << 64}, "sampling_seed"),
        ({"logit_bias": {"100": 1.0}}, "logit_bias"),
        ({"logit_bias": {"-1": 1.0}}, "logit_bias"),
        ({"logit_bias": {"3": math.inf}}, "logit_bias"),
        ({"logit_bias": {"3": math.nan}}, "logit_bias"),
        ({"stop": ["x"] * (MAX_STOP_ENTRIES + 1)}, "stop"),
        ({"stop": ["ok", ""]}, "stop"),
        ({"stop_regex": [""]}, "stop_regex"),
    ],
)
def test_verify_bounds_name_the_param(overrides: dict, param: str) -> None:
    p = SamplingParams.from_dict(overrides)
    err = _error(p.verify, VOCAB)
    assert err.param == param
    assert param in str(err)


@pytest.mark.parametrize(
    "overrides",
    [
        {"regex": "a+", "json_schema": "{}"},
        {"regex": "a+", "ebnf": "root ::= 'a'"},
        {"json_schema": "{}", "ebnf": "root ::= 'a'"},
    ],
)
def test_at_most_one_grammar(overrides: dict) -> None:
    err = _error(SamplingParams.from_dict(overrides).verify, VOCAB)
    assert err.param in overrides
    assert "Only one of regex, json_schema, or ebnf" in str(err)


@pytest.mark.parametrize(
    "overrides",
    [
        {"temperature": 0.0},
        {"top_p": 1.0, "top_k": 1, "min_p": 1.0},
        {"top_k": 1 << 30},
        {"frequency_penalty": -2.0, "presence_penalty": 2.0, "repetition_penalty": 2.0},
        {"max_new_tokens": None, "min_new_tokens": 50},
        {"max_new_tokens": 0},
        {"min_new_tokens": 5, "max_new_tokens": 5},
        {"n": MAX_N},
        {"logit_bias": {"0": -100, "99": 100}},
        {"stop": ["x"] * MAX_STOP_ENTRIES},
        {"regex": "a+", "structural_tag": "{}"},
        {"sampling_seed": -5},
    ],
)
def test_verify_accepts_boundaries(overrides: dict) -> None:
    SamplingParams.from_dict(overrides).verify(VOCAB)


def test_stop_token_ids_not_checked_against_vocab() -> None:
    SamplingParams.from_dict({"stop_token_ids": [VOCAB + 1000]}).verify(VOCAB)


def test_is_greedy() -> None:
    assert SamplingParams(temperature=0.0).is_greedy
    assert SamplingParams(temperature=5e-7).is_greedy
    assert SamplingParams(temperature=0.7, top_k=1).is_greedy
    assert not SamplingParams(temperature=1e-5).is_greedy
    assert not SamplingParams(top_k=2).is_greedy


def test_round_trip_through_json() -> None:
    p = SamplingParams.from_dict(
        {
            "max_new_tokens": 7,
            "min_new_tokens": 2,
            "temperature": 0.3,
            "top_p": 0.9,
            "top_k": 20,
            "min_p": 0.05,
            "frequency_penalty": 0.5,
            "presence_penalty": -0.5,
            "repetition_penalty": 1.2,
            "stop": "###",
            "stop_token_ids": [5, 2],
            "stop_regex": ["a+b"],
            "ignore_eos": True,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
            "no_stop_trim": True,
            "n": 3,
            "seed": 1234,
            "logit_bias": {"4": 1.5},
            "regex": "[0-9]+",
            "custom_params": {"k": [1, 2]},
            "stream_interval": 4,
        }
    )
    d = p.to_dict()
    restored = SamplingParams.from_dict(json.loads(json.dumps(d)))
    assert restored == p
    assert d["logit_bias"] == {"4": 1.5}
    assert d["stop_token_ids"] == [2, 5]
    assert SamplingParams.from_dict(SamplingParams().to_dict()) == SamplingParams()


def test_direct_construction_is_validated() -> None:
    with pytest.raises(SamplingParamsError) as info:
        SamplingParams(temperature="hot")  # type: ignore[arg-type]
    assert info.value.param == "temperature"
    assert SamplingParams(stop="x").stop == ["x"]  # type: ignore[arg-type]


def test_error_is_a_value_error() -> None:
    assert issubclass(SamplingParamsError, ValueError)
    with pytest.raises(SamplingParamsError):
        SamplingParams.from_dict([("temperature", 1.0)])  # type: ignore[arg-type]
