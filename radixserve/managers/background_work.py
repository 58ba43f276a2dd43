"""Requests waiting on work another thread does for them (a grammar compiling, images being
processed): each waits in a queue of its own instead of the scheduler's, so that work never
stalls the other requests' steps. The scheduler collects the finished ones every step; an
aborted request (finished meanwhile) is dropped when its turn comes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from radixserve.managers.schedule_batch import Req

T = TypeVar("T")


class BackgroundQueue(Generic[T]):
    def __init__(self, refusals: tuple[type[Exception], ...]) -> None:
        # The exceptions that mean the request's fault (its 400), not the server's.
        self.refusals = refusals
        self._items: list[tuple[Req, Future[T]]] = []

    def add(self, req: Req, future: Future[T]) -> None:
        self._items.append((req, future))

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self) -> Iterator[tuple[Req, Future[T]]]:
        return iter(list(self._items))

    def reqs(self) -> list[Req]:
        return [req for req, _ in self._items]

    def collect(self, apply: Callable[[Req, T], None]) -> tuple[list[Req], list[tuple[Req, str]]]:
        """Requests whose work finished, given its result by `apply`, and the ones it refused
        (one of `refusals`, raised by the work or by `apply`), with the reason."""
        ready: list[Req] = []
        failed: list[tuple[Req, str]] = []
        pending = []
        for req, future in self._items:
            if req.finished:
                continue
            if not future.done():
                pending.append((req, future))
                continue
            try:
                apply(req, future.result())
                ready.append(req)
            except self.refusals as exc:
                failed.append((req, str(exc)))
        self._items = pending
        return ready, failed
