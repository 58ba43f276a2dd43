"""Exceptions of the option layer; ``str()`` of each is one line meant for the user."""

from __future__ import annotations


class OptionError(ValueError):
    """A bad command line or config file (unknown option, bad value, unreadable file)."""


class ServerArgsError(ValueError):
    """Server arguments that parse but cannot be used together or on this machine.

    ``option`` names the offending option (``--page-size``), so callers can point at it.
    """

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message if message.startswith(option) else f"{option}: {message}")
        self.option = option
