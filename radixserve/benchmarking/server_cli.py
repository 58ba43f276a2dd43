"""Command lines that mix a tool's own flags with every `radixserve serve` option, as SGLang's
bench_one_batch and bench_offline_throughput take ServerArgs' flags beside their own."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixserve.server_args import ServerArgs

SERVER_OPTIONS_NOTE = (
    "Every `radixserve serve` option is accepted too (model, dtype, memory, scheduling ...): "
    "see `radixserve serve --help`."
)


def new_parser(prog: str, description: str) -> argparse.ArgumentParser:
    # No abbreviations: an abbreviated server option must reach the server parser intact.
    return argparse.ArgumentParser(
        prog=prog, description=description, epilog=SERVER_OPTIONS_NOTE, allow_abbrev=False
    )


def parse_with_server_args(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> tuple[argparse.Namespace, ServerArgs]:
    """The tool's flags from `argv`; everything else is parsed as `radixserve serve` options.
    Bad options exit with status 2 and a one-line message, as argparse does."""
    from radixserve.server_args import OptionError, ServerArgs, ServerArgsError

    args, rest = parser.parse_known_args(argv)
    try:
        server_args = ServerArgs.from_cli(rest)
    except (OptionError, ServerArgsError) as exc:
        parser.error(str(exc))
    return args, server_args


def configure_logging(level: str) -> None:
    logging.basicConfig(format="[%(asctime)s] %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(level.upper())
