"""The `sglang serve` option surface, declared as data.

Each area module (model.py, scheduling.py, kernels.py, ...) lists its options as ``OptionSpec``
values; ``registry`` assembles them in help order, and the argparse parser, the grouped
``--help``, docs/options.md and ServerArgs are all generated from that one table. See
``radixserve.server_args`` for the resolved configuration built from these options.
"""

from __future__ import annotations

from radixserve.options.command_line import parse_command_line
from radixserve.options.errors import OptionError, ServerArgsError
from radixserve.options.parser import build_parser
from radixserve.options.registry import all_options, areas, dest_table, spec_for_dest
from radixserve.options.spec import Kind, OptionSpec, Support

__all__ = [
    "Kind",
    "OptionError",
    "OptionSpec",
    "ServerArgsError",
    "Support",
    "all_options",
    "areas",
    "build_parser",
    "dest_table",
    "parse_command_line",
    "spec_for_dest",
]
