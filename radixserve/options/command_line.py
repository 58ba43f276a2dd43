"""The whole ``radixserve serve`` command line -> {dest: value} of what the user set."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from radixserve.options.config_file import config_tokens, split_config_arg
from radixserve.options.errors import OptionError
from radixserve.options.parser import PROG, parse_args


def parse_command_line(argv: Sequence[str], prog: str = PROG) -> dict[str, Any]:
    """Parse ``[MODEL_PATH] [--config FILE.yaml] [options]``.

    A leading positional is the model path (``sglang serve PATH`` does the same). Config file
    values are parsed first and the command line second, so the command line wins.
    ``--help`` prints the help and raises SystemExit(0).
    """
    tokens = list(argv)
    if tokens and not tokens[0].startswith("-"):
        tokens = ["--model-path", tokens[0], *tokens[1:]]
    split = split_config_arg(tokens)
    values: dict[str, Any] = {}
    if split.config_path is not None:
        try:
            values.update(parse_args(config_tokens(split.config_path), prog))
        except OptionError as exc:
            message = str(exc)
            if not message.startswith("config file"):
                message = f"config file {split.config_path}: {message}"
            raise OptionError(message) from None
        values["config"] = split.config_path
    values.update(parse_args(split.argv, prog))
    return values
