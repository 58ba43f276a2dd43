"""``--config FILE.yaml``: options from a YAML mapping, merged under the command line.

Like SGLang, each ``key: value`` becomes command-line tokens placed before the real command
line, so argparse validates file values exactly like typed ones and the last occurrence wins
(command line > config file > defaults). Unlike SGLang, an unknown key is an error that names
it rather than an argparse usage dump, and ``--config=FILE`` is recognised too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from radixserve.options.errors import OptionError
from radixserve.options.parser import suggest
from radixserve.options.registry import all_options, by_option_string
from radixserve.options.spec import Kind, OptionSpec

CONFIG_OPTION = "--config"


class SplitArgv(NamedTuple):
    """The command line with ``--config FILE`` taken out."""

    config_path: str | None
    argv: list[str]


def split_config_arg(argv: Sequence[str]) -> SplitArgv:
    """Find ``--config FILE`` / ``--config=FILE``; at most one is allowed."""
    paths: list[str] = []
    rest: list[str] = []
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == CONFIG_OPTION:
            if i + 1 >= len(tokens) or tokens[i + 1].startswith("--"):
                raise OptionError("argument --config: expected a YAML file path")
            paths.append(tokens[i + 1])
            i += 2
            continue
        if token.startswith(CONFIG_OPTION + "="):
            paths.append(token.split("=", 1)[1])
        else:
            rest.append(token)
        i += 1
    if len(paths) > 1:
        raise OptionError(f"argument --config: given {len(paths)} times; only one file is allowed")
    return SplitArgv(paths[0] if paths else None, rest)


def _read_mapping(path: str) -> dict[Any, Any]:
    import yaml  # only needed when a config file is used

    file = Path(path)
    if file.suffix not in (".yaml", ".yml"):
        raise OptionError(f"config file {path}: must be a YAML file ending in .yaml or .yml")
    if not file.is_file():
        raise OptionError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise OptionError(f"config file {path}: invalid YAML{line}: {problem}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise OptionError(f"config file {path}: cannot read it: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise OptionError(
            f"config file {path}: expected a mapping of option: value at the top level, "
            f"got {type(data).__name__}"
        )
    return data


def _lookup(key: Any, path: str) -> OptionSpec:
    name = "--" + str(key).removeprefix("--").replace("_", "-")
    spec = by_option_string().get(name)
    if spec is not None:
        return spec
    # Keys may also be spelled as the dest, which differs from the flag for a few options
    # (fp8_gemm_runner_backend is --fp8-gemm-backend).
    dest = str(key).removeprefix("--").replace("-", "_")
    for candidate in all_options():
        if candidate.dest == dest and not candidate.is_deprecated:
            return candidate
    hint = suggest(name, list(by_option_string()))
    raise OptionError(f"config file {path}: unknown option '{key}'{hint}")


def _scalar(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _tokens(spec: OptionSpec, key: Any, value: Any, path: str) -> list[str]:
    if value is None:
        return []
    if spec.kind in (Kind.FLAG, Kind.DEPRECATED_CONST, Kind.DEPRECATED_NOOP):
        if not isinstance(value, bool):
            raise OptionError(f"config file {path}: '{key}' is a flag; use true or false")
        return [spec.name] if value else []
    if spec.kind is Kind.BOOL_OPT:
        if not isinstance(value, bool):
            raise OptionError(f"config file {path}: '{key}' must be true or false")
        return [spec.name if value else "--no-" + spec.name[2:]]
    if spec.nargs in ("+", "*"):
        items = value if isinstance(value, list) else [value]
        if not items:
            return [spec.name] if spec.nargs == "*" else []
        return [spec.name, *(_scalar(item) for item in items)]
    # --x=value keeps values such as "-1" from being read as options.
    return [f"{spec.name}={_scalar(value)}"]


def config_tokens(path: str) -> list[str]:
    """The command-line tokens equivalent to the YAML file at ``path``."""
    tokens: list[str] = []
    for key, value in _read_mapping(path).items():
        spec = _lookup(key, path)
        if spec.name == CONFIG_OPTION:
            raise OptionError(f"config file {path}: a config file cannot name another config file")
        tokens.extend(_tokens(spec, key, value, path))
    return tokens
