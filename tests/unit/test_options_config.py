"""--config FILE.yaml: dash or underscore keys, command line wins, clear one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixserve.options.command_line import parse_command_line
from radixserve.options.config_file import config_tokens, split_config_arg
from radixserve.options.errors import OptionError


def _write(tmp_path: Path, text: str, name: str = "server.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_keys_with_dashes_or_underscores_and_all_value_kinds(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "model-path: /models/m\n"
        "tp_size: 1\n"
        "mem_fraction_static: 0.5\n"
        "context-length: 32k\n"
        "disable_radix_cache: true\n"
        "enable-metrics: false\n"
        "gc_threshold: [10, 20]\n"
        "preferred_sampling_params: {temperature: 0.3}\n"
        "chunked_prefill_size: -1\n"
        "lora_strict_loading: false\n"
        "fp8_gemm_runner_backend: triton\n"
        "revision: null\n",
    )
    values = parse_command_line(["--config", path])
    assert values == {
        "config": path,
        "model_path": "/models/m",
        "tp_size": 1,
        "mem_fraction_static": 0.5,
        "context_length": 32_000,
        "disable_radix_cache": True,
        "gc_threshold": [10, 20],
        "preferred_sampling_params": {"temperature": 0.3},
        "chunked_prefill_size": -1,
        "lora_strict_loading": False,
        "fp8_gemm_runner_backend": "triton",
    }


def test_command_line_overrides_config_either_side(tmp_path: Path) -> None:
    path = _write(tmp_path, "port: 1234\nhost: 0.0.0.0\nmax_running_requests: 8\n")
    values = parse_command_line(["--port", "9", "--config", path, "--max-running-requests", "3"])
    assert values["port"] == 9
    assert values["max_running_requests"] == 3
    assert values["host"] == "0.0.0.0"
    assert parse_command_line([f"--config={path}"])["port"] == 1234


def test_positional_model_path_works_like_model_path() -> None:
    assert parse_command_line(["/m", "--tp", "1"]) == {"model_path": "/m", "tp_size": 1}


def _error(argv: list[str]) -> str:
    with pytest.raises(OptionError) as info:
        parse_command_line(argv)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_missing_config_file(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.yaml")
    assert _error(["--config", missing]) == f"config file not found: {missing}"


def test_bad_yaml_names_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "port: 1\nhost: [unclosed\n")
    message = _error(["--config", path])
    assert message.startswith(f"config file {path}: invalid YAML (line ")


def test_non_mapping_root(tmp_path: Path) -> None:
    path = _write(tmp_path, "- port\n- 1\n")
    assert _error(["--config", path]) == (
        f"config file {path}: expected a mapping of option: value at the top level, got list"
    )


def test_unknown_key_is_named_with_a_suggestion(tmp_path: Path) -> None:
    path = _write(tmp_path, "tp-sise: 2\n")
    assert _error(["--config", path]) == (
        f"config file {path}: unknown option 'tp-sise' (did you mean --tp-size?)"
    )


def test_bad_value_in_config_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "dtype: fp64\n")
    message = _error(["--config", path])
    assert message.startswith(f"config file {path}: argument --dtype: invalid choice: 'fp64'")
    flag = _write(tmp_path, "trust_remote_code: yes please\n", "flag.yaml")
    assert _error(["--config", flag]) == (
        f"config file {flag}: 'trust_remote_code' is a flag; use true or false"
    )


def test_config_path_rules(tmp_path: Path) -> None:
    path = _write(tmp_path, "port: 1\n")
    assert "only one file" in _error(["--config", path, "--config", path])
    assert _error(["--config"]) == "argument --config: expected a YAML file path"
    text = _write(tmp_path, "port: 1\n", "server.txt")
    assert _error(["--config", text]).endswith("must be a YAML file ending in .yaml or .yml")


def test_split_and_tokens(tmp_path: Path) -> None:
    path = _write(tmp_path, "enable_lora: true\nlora_paths: [a, b]\nhost: h\n")
    assert split_config_arg(["--tp", "1", "--config", path]) == (path, ["--tp", "1"])
    assert config_tokens(path) == ["--enable-lora", "--lora-paths", "a", "b", "--host=h"]
