"""Option parity with `sglang serve`: every option of SGLang's usage text parses here the same way.

The usage text (tests/data/sglang-serve-usage.txt) is SGLang's own argparse usage line, so this
catches drift in option spellings, value-taking, nargs and choice lists.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import NamedTuple

import pytest

from radixserve.options.parser import build_parser
from radixserve.options.registry import all_options, by_option_string, dest_table
from radixserve.options.value_types import INT, TOKENS

USAGE = Path(__file__).parent.parent / "data" / "sglang-serve-usage.txt"


class UsageOption(NamedTuple):
    name: str
    kind: str  # "flag", "bool_opt" or "value"
    nargs: str | None
    choices: tuple[str, ...] | None


def _groups(text: str) -> list[str]:
    """The top-level [...] groups of the usage line, plus the one required option."""
    body = text[text.index("usage: sglang serve") :]
    body = body[: body.index("sglang serve: error:")]
    groups, depth, current = [], 0, ""
    for char in body:
        if char == "[":
            depth += 1
            if depth == 1:
                current = ""
                continue
        elif char == "]":
            depth -= 1
            if depth == 0:
                groups.append(current.strip())
                continue
        if depth:
            current += char
    required = re.search(r"\] (--model-path MODEL_PATH) \[", body)
    assert required is not None
    return [required.group(1), *groups]


def _option(group: str) -> UsageOption | None:
    if group == "-h":
        return None
    if " | " in group:
        return UsageOption(group.split(" | ")[0], "bool_opt", None, None)
    name, _, rest = group.partition(" ")
    if not rest:
        return UsageOption(name, "flag", None, None)
    choices_match = re.search(r"\{([^}]*)\}", rest)
    choices = tuple(choices_match.group(1).split(",")) if choices_match else None
    if rest.startswith("["):
        nargs = "*" if "..." in rest else "?"
    else:
        nargs = "+" if "..." in rest else None
    return UsageOption(name, "value", nargs, choices)


def _usage_options() -> list[UsageOption]:
    options = [_option(group) for group in _groups(USAGE.read_text(encoding="utf-8"))]
    return [option for option in options if option is not None]


USAGE_OPTIONS = _usage_options()


def _actions() -> dict[str, argparse.Action]:
    parser = build_parser()
    return {name: action for action in parser._actions for name in action.option_strings}


def test_usage_text_is_parsed_completely() -> None:
    # ~490 options in SGLang's usage; a broken reader would find far fewer.
    assert len(USAGE_OPTIONS) >= 480
    names = [option.name for option in USAGE_OPTIONS]
    assert "--model-path" in names and "--cuda-graph-max-bs-decode" in names
    assert len(names) == len(set(names))


@pytest.mark.parametrize("usage", USAGE_OPTIONS, ids=lambda option: option.name)
def test_option_parses_like_sglang(usage: UsageOption) -> None:
    action = _actions().get(usage.name)
    assert action is not None, f"{usage.name} is missing"
    if usage.kind == "bool_opt":
        assert isinstance(action, argparse.BooleanOptionalAction)
        assert "--no-" + usage.name[2:] in action.option_strings
    elif usage.kind == "flag":
        assert action.nargs == 0 and not isinstance(action, argparse.BooleanOptionalAction)
    else:
        assert action.nargs == usage.nargs, f"{usage.name}: nargs {action.nargs!r}"
    actual = tuple(map(str, action.choices)) if action.choices is not None else None
    assert actual == usage.choices, f"{usage.name}: choices differ"


def test_every_usage_option_value_round_trips() -> None:
    """Each value option accepts a value of its choices (or a plain one) without error."""
    parser = build_parser()
    specs = by_option_string()
    checked = 0
    for usage in USAGE_OPTIONS:
        if usage.kind != "value" or usage.nargs == "?":
            continue
        action = _actions()[usage.name]
        if usage.choices:
            sample = usage.choices[-1]
        elif specs[usage.name].vtype in (INT, TOKENS):
            sample = "3"
        else:
            continue
        checked += 1
        namespace, extras = parser.parse_known_args([usage.name, sample])
        assert not extras
        value = getattr(namespace, action.dest)
        expected = [value] if usage.nargs is None else value
        assert str(expected[0]) == sample
    assert checked > 150


# Defaults stated in the SGLang reference notes (sglang-surface.md section 1.6).
SGLANG_DEFAULTS = {
    "tokenizer_mode": "auto",
    "skip_tokenizer_init": False,
    "load_format": "auto",
    "trust_remote_code": False,
    "context_length": None,
    "tokenizer_worker_num": 1,
    "detokenizer_worker_num": 1,
    "model_impl": "auto",
    "json_model_override_args": "{}",
    "dtype": "auto",
    "quantization": None,
    "kv_cache_dtype": "auto",
    "cpu_offload_gb": 0,
    "mem_fraction_static": None,
    "max_running_requests": None,
    "max_prefill_tokens": 16384,
    "schedule_policy": "fcfs",
    "schedule_conservativeness": 1.0,
    "page_size": None,
    "retraction_policy": "length",
    "tp_size": 1,
    "dp_size": 1,
    "pp_size": 1,
    "load_balance_method": "auto",
    "base_gpu_id": 0,
    "watchdog_timeout": 300,
    "nnodes": 1,
    "node_rank": 0,
    "ep_size": 1,
    "torch_compile_max_bs": 32,
    "speculative_ngram_max_trie_depth": 18,
    "speculative_ngram_capacity": 10_000_000,
    "max_loras_per_batch": 8,
    "lora_eviction_policy": "lru",
    "lora_backend": "csgmv",
    "radix_eviction_policy": "lru",
    "hicache_size": 0,
    "hicache_write_policy": "write_through",
    "disaggregation_mode": "null",
    "disaggregation_transfer_backend": "mooncake",
    "disaggregation_bootstrap_port": 8998,
    "num_reserved_decode_tokens": 512,
    "log_level": "info",
    "log_requests_level": 2,
    "decode_log_interval": 40,
    "otlp_traces_endpoint": "localhost:4317",
    "host": "127.0.0.1",
    "port": 30000,
    "stream_interval": 1,
    "sampling_defaults": "model",
}


@pytest.mark.parametrize("dest", sorted(SGLANG_DEFAULTS))
def test_defaults_match_sglang(dest: str) -> None:
    assert dest_table()[dest].default == SGLANG_DEFAULTS[dest]


def test_every_usage_option_has_help_and_an_area() -> None:
    names = {option.name for option in USAGE_OPTIONS}
    for spec in all_options():
        if spec.name in names:
            assert spec.help, spec.name
            assert spec.area, spec.name
