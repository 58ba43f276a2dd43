"""The argparse surface of ``radixserve serve``, generated from the option specs.

Parsing returns only the options the user gave (every action's default is SUPPRESS), so the
caller can layer defaults < config file < command line and can tell "set" from "defaulted".
Every failure raises ``OptionError`` whose text is one line for the user; argparse's own habit
of dumping the whole usage (about 500 options) before the error is avoided on purpose.
"""

from __future__ import annotations

import argparse
import difflib
import functools
from collections.abc import Sequence
from typing import Any

from radixserve.options.actions import (
    DeprecatedAliasAction,
    DeprecatedConstAction,
    DeprecatedNoopAction,
)
from radixserve.options.errors import OptionError
from radixserve.options.registry import all_options, areas, by_option_string
from radixserve.options.spec import Kind, OptionSpec, Support

PROG = "radixserve serve"

_DESCRIPTION = (
    "Serve a model over HTTP with SGLang's command line. Every `sglang serve` option is "
    "accepted; options marked [not applicable] are ignored with a warning and options marked "
    "[not supported yet] are refused unless left at their default."
)
_SHORT_DESCRIPTION = (
    "Serve a model over HTTP with SGLang's command line. Every `sglang serve` option is "
    "accepted; the options below have an effect here."
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise OptionError(message)


def _support_note(spec: OptionSpec) -> str:
    if spec.support is Support.NOT_APPLICABLE:
        return " [not applicable: accepted and ignored]"
    if spec.support is Support.UNSUPPORTED:
        return " [not supported yet]"
    if spec.supported_choices is not None:
        return f" [supported here: {', '.join(map(str, spec.supported_choices))}]"
    return ""


def help_text(spec: OptionSpec) -> str:
    """The help line of an option, with its default and support level."""
    text = spec.help
    if spec.kind is Kind.VALUE and spec.default not in (None, (), ""):
        text += f" (default: {spec.default})"
    if spec.kind is Kind.BOOL_OPT and spec.default is not None:
        text += f" (default: {spec.default})"
    return text + _support_note(spec)


def shown_in_short_help(spec: OptionSpec) -> bool:
    """`--help` lists the options that have an effect here; `--help-all` lists every one."""
    return not spec.hidden and spec.support is Support.IMPLEMENTED and not spec.is_deprecated


def _add(group: argparse._ArgumentGroup, spec: OptionSpec, show_all: bool) -> None:
    # argparse %-formats help strings.
    visible = not spec.hidden and (show_all or shown_in_short_help(spec))
    helptext = help_text(spec).replace("%", "%%") if visible else argparse.SUPPRESS
    common: dict[str, Any] = {"dest": spec.dest, "default": argparse.SUPPRESS, "help": helptext}
    names = spec.option_strings
    if spec.kind is Kind.VALUE:
        assert spec.vtype is not None
        extra: dict[str, Any] = {"const": spec.const} if spec.nargs == "?" else {}
        group.add_argument(
            *names, type=spec.vtype.parse, nargs=spec.nargs, choices=spec.choices, **extra, **common
        )
    elif spec.kind is Kind.FLAG:
        group.add_argument(*names, action="store_true", **common)
    elif spec.kind is Kind.BOOL_OPT:
        group.add_argument(*names, action=argparse.BooleanOptionalAction, **common)
    elif spec.kind is Kind.DEPRECATED_ALIAS:
        assert spec.vtype is not None and spec.replacement is not None
        group.add_argument(
            *names,
            action=DeprecatedAliasAction,
            type=spec.vtype.parse,
            nargs=spec.nargs,
            choices=spec.choices,
            replacement=spec.replacement,
            value_map=spec.value_map,
            **common,
        )
    elif spec.kind is Kind.DEPRECATED_CONST:
        assert spec.replacement is not None
        group.add_argument(
            *names,
            action=DeprecatedConstAction,
            const=spec.const,
            replacement=spec.replacement,
            **common,
        )
    else:
        group.add_argument(
            *names, action=DeprecatedNoopAction, note=spec.replacement or "", **common
        )


class _HelpAllAction(argparse.Action):
    """--help-all: the full option list (every `sglang serve` option, with its support level)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        build_parser(parser.prog, show_all=True).print_help()  # to stdout, as --help
        parser.exit()


@functools.cache
def build_parser(prog: str = PROG, show_all: bool = False) -> argparse.ArgumentParser:
    """The parser, one argument group per area. Cached: argparse parsers are reusable.
    Both variants parse every option; `show_all` only changes what --help prints."""
    # allow_abbrev stays on: SGLang users rely on --tp, --dp, --mem-frac, --context-len ...
    hidden = sum(1 for spec in all_options() if not spec.hidden and not shown_in_short_help(spec))
    parser = _Parser(
        prog=prog,
        usage=f"{prog} [MODEL_PATH] [--config FILE.yaml] [options]",
        description=_DESCRIPTION if show_all else _SHORT_DESCRIPTION,
        epilog=None
        if show_all
        else (
            f"Only the options that have an effect here are listed. {hidden} more (deprecated, "
            f"not applicable on this hardware, or not supported yet) are accepted as SGLang "
            f"spells them: `{prog} --help-all` lists every option with its support level."
        ),
        allow_abbrev=True,
    )
    parser.add_argument(
        "--help-all",
        action=_HelpAllAction,
        help="list every `sglang serve` option, with its support level here, and exit",
    )
    groups = {area: parser.add_argument_group(area) for area in areas()}
    for spec in all_options():
        _add(groups[spec.area], spec, show_all)
    return parser


def suggest(word: str, candidates: Sequence[str]) -> str:
    """`` (did you mean X?)`` for the closest candidates, or an empty string."""
    scored = sorted(
        ((difflib.SequenceMatcher(None, word, c).ratio(), c) for c in candidates), reverse=True
    )
    # Only near-misses, and only those about as close as the best one: a list of loosely
    # similar option names helps nobody.
    close = [c for ratio, c in scored[:3] if ratio >= 0.75 and ratio >= scored[0][0] - 0.1]
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def _unrecognized(extras: Sequence[str], prog: str) -> OptionError:
    for token in extras:
        if token.startswith("-"):
            option = token.split("=", 1)[0]
            hint = suggest(option, list(by_option_string())) or f" (see {prog} --help)"
            return OptionError(f"unrecognized option '{option}'{hint}")
    return OptionError(
        f"unexpected argument '{extras[0]}' (a model path may only come first: {prog} PATH ...)"
    )


def parse_args(argv: Sequence[str], prog: str = PROG) -> dict[str, Any]:
    """Parse ``argv`` into {dest: value} for the options present. ``--help`` exits (SystemExit)."""
    namespace, extras = build_parser(prog).parse_known_args(list(argv))
    if extras:
        raise _unrecognized(extras, prog)
    return vars(namespace)
