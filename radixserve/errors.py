"""The one base class for errors that are the client's fault.

Anything that refuses a request because of what the client sent (a bad field, a value out of
range, an unusable grammar, a prompt too long) raises a subclass of ``InvalidRequestError``; the
HTTP layer answers those with a 400 naming ``param``. Every other exception raised while a
request runs, a ``ValueError`` from a bug included, is an internal error: a logged 500 whose
body carries only an error id to find the log entry by.

It subclasses ``ValueError`` so that offline ``Engine`` callers can keep catching ValueError.
This module imports nothing from radixserve, so every layer may use it.
"""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request refused because of its content; ``param`` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param
