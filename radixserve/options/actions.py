"""argparse actions for SGLang's deprecated spellings: warn once per use, then store."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping, Sequence
from typing import Any

logger = logging.getLogger(__name__)


def deprecation_message(old: str, new: str) -> str:
    """SGLang's wording for a deprecated option, on one line."""
    return f"'{old}' is deprecated and will be removed in a future release. Use '{new}' instead."


class DeprecatedAliasAction(argparse.Action):
    """Stores the value (translated through ``value_map`` if given) into the new option's dest."""

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        *,
        replacement: str,
        value_map: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.replacement = replacement
        self.value_map = value_map

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        logger.warning(
            deprecation_message(option_string or self.option_strings[0], self.replacement)
        )
        if self.value_map is not None and isinstance(values, str):
            values = self.value_map.get(values, values)
        setattr(namespace, self.dest, values)


class DeprecatedConstAction(argparse.Action):
    """A flag (no value) that stores ``const`` into the new option's dest."""

    def __init__(
        self, option_strings: Sequence[str], dest: str, *, replacement: str, **kwargs: Any
    ) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)
        self.replacement = replacement

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        logger.warning(
            deprecation_message(option_string or self.option_strings[0], self.replacement)
        )
        setattr(namespace, self.dest, self.const)


class DeprecatedNoopAction(argparse.Action):
    """A flag that has no effect any more; it only says so."""

    def __init__(
        self, option_strings: Sequence[str], dest: str, *, note: str, **kwargs: Any
    ) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)
        self.note = note

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        logger.warning("'%s' is deprecated: %s", option_string, self.note)
