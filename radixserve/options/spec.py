"""The data model of a command-line option and the helpers the area modules declare options with.

Every option of ``radixserve serve`` is one ``OptionSpec``. argparse, the grouped ``--help``,
docs/options.md, ServerArgs' fields and the startup support checks are all generated from these
specs, so an option is declared in exactly one place.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from radixserve.options.value_types import STR, ValueType


class Support(enum.Enum):
    """How honestly radixserve handles an option."""

    IMPLEMENTED = "implemented"
    """The option has a real effect."""
    NOT_APPLICABLE = "not applicable"
    """A hardware or kernel knob with no meaning here: accepted, one startup warning if set."""
    UNSUPPORTED = "not supported yet"
    """Not implemented: a non-default value is refused at startup."""


IMPLEMENTED = Support.IMPLEMENTED
NOT_APPLICABLE = Support.NOT_APPLICABLE
UNSUPPORTED = Support.UNSUPPORTED


class Kind(enum.Enum):
    """The argparse behaviour of an option."""

    VALUE = "value"  # takes a value (nargs None, '?', '*' or '+')
    FLAG = "flag"  # store_true
    BOOL_OPT = "bool_opt"  # BooleanOptionalAction: --x / --no-x
    DEPRECATED_ALIAS = "deprecated_alias"  # warns, stores its value into another option's dest
    DEPRECATED_CONST = "deprecated_const"  # warns, stores a constant into another option's dest
    DEPRECATED_NOOP = "deprecated_noop"  # warns, stores nothing


DEPRECATED_KINDS = frozenset({Kind.DEPRECATED_ALIAS, Kind.DEPRECATED_CONST, Kind.DEPRECATED_NOOP})


@dataclass(frozen=True)
class OptionSpec:
    """One command-line option, as data.

    Invariants: ``name`` starts with ``--``; ``dest`` is SGLang's dest (the ServerArgs attribute);
    ``choices`` and ``supported_choices`` are tuples and ``supported_choices`` is a subset of
    ``choices``; deprecated kinds name the option that replaces them in ``replacement`` and store
    into the replacement's dest. ``area`` is stamped by the registry from the declaring module.
    """

    name: str
    dest: str
    kind: Kind
    help: str
    vtype: ValueType | None = None
    default: Any = None
    nargs: str | None = None
    choices: tuple[Any, ...] | None = None
    support: Support = UNSUPPORTED
    aliases: tuple[str, ...] = ()
    supported_choices: tuple[Any, ...] | None = None
    const: Any = None
    replacement: str | None = None
    value_map: Mapping[str, Any] | None = None
    hidden: bool = False
    area: str = ""

    @property
    def option_strings(self) -> tuple[str, ...]:
        """Every spelling argparse accepts for this option (the --no- form excluded)."""
        return (self.name, *self.aliases)

    @property
    def is_deprecated(self) -> bool:
        return self.kind in DEPRECATED_KINDS

    @property
    def kwarg_name(self) -> str:
        """The Python keyword spelling of this option's own name (e.g. ``cuda_graph_max_bs``)."""
        return self.name[2:].replace("-", "_")


def _dest(name: str, dest: str | None) -> str:
    if not name.startswith("--"):
        raise ValueError(f"option name must start with '--': {name!r}")
    return dest if dest is not None else name[2:].replace("-", "_")


def value(
    name: str,
    vtype: ValueType,
    default: Any = None,
    help: str = "",
    *,
    support: Support = UNSUPPORTED,
    choices: tuple[Any, ...] | None = None,
    supported_choices: tuple[Any, ...] | None = None,
    nargs: str | None = None,
    aliases: tuple[str, ...] = (),
    dest: str | None = None,
    const: Any = None,
    hidden: bool = False,
) -> OptionSpec:
    """Declare an option that takes a value."""
    if supported_choices is not None and choices is not None:
        extra = set(supported_choices) - set(choices)
        if extra:
            raise ValueError(f"{name}: supported_choices {sorted(extra)} not in choices")
    return OptionSpec(
        name=name,
        dest=_dest(name, dest),
        kind=Kind.VALUE,
        help=help,
        vtype=vtype,
        default=default,
        nargs=nargs,
        choices=choices,
        support=support,
        aliases=aliases,
        supported_choices=supported_choices,
        const=const,
        hidden=hidden,
    )


def flag(
    name: str,
    help: str = "",
    *,
    support: Support = UNSUPPORTED,
    aliases: tuple[str, ...] = (),
    dest: str | None = None,
    default: bool | None = False,
) -> OptionSpec:
    """Declare a ``store_true`` flag. SGLang's ``Optional[bool]`` flags default to None."""
    return OptionSpec(
        name=name,
        dest=_dest(name, dest),
        kind=Kind.FLAG,
        help=help,
        default=default,
        support=support,
        aliases=aliases,
    )


def bool_opt(
    name: str, help: str = "", *, default: bool | None = None, support: Support = UNSUPPORTED
) -> OptionSpec:
    """Declare a ``--x/--no-x`` option."""
    return OptionSpec(
        name=name,
        dest=_dest(name, None),
        kind=Kind.BOOL_OPT,
        help=help,
        default=default,
        support=support,
    )


def deprecated_alias(
    name: str,
    replacement: str,
    dest: str,
    vtype: ValueType = STR,
    *,
    nargs: str | None = None,
    choices: tuple[Any, ...] | None = None,
    value_map: Mapping[str, Any] | None = None,
    hidden: bool = False,
) -> OptionSpec:
    """Declare an old spelling that warns and stores its (optionally translated) value in ``dest``."""
    return OptionSpec(
        name=name,
        dest=dest,
        kind=Kind.DEPRECATED_ALIAS,
        help=f"Deprecated: use {replacement}.",
        vtype=vtype,
        nargs=nargs,
        choices=choices,
        replacement=replacement,
        value_map=value_map,
        hidden=hidden,
    )


def deprecated_const(name: str, replacement: str, dest: str, const: Any = True) -> OptionSpec:
    """Declare an old flag that warns and stores ``const`` in ``dest``."""
    return OptionSpec(
        name=name,
        dest=dest,
        kind=Kind.DEPRECATED_CONST,
        help=f"Deprecated: use {replacement}.",
        const=const,
        replacement=replacement,
    )


def deprecated_noop(name: str, note: str) -> OptionSpec:
    """Declare an old flag that only warns."""
    return OptionSpec(
        name=name,
        dest=_dest(name, None),
        kind=Kind.DEPRECATED_NOOP,
        help=f"Deprecated: {note}",
        replacement=note,
    )
