"""Compiled grammars, cached per ``GrammarSpec``, compiled off the caller's thread with a
deadline.

Why a thread per compile rather than a pool: a grammar that takes minutes to compile would hold
a pool worker for that long and queue every later grammar behind it. Each uncached spec gets its
own daemon thread instead. Python cannot stop a thread that is inside a native compile, so a
compile that outlives its deadline keeps running in the background: its waiters get
``GrammarError`` at the deadline, and when it does finish its result is cached (a later request
for the same grammar is then served at once). The grammar libraries release the GIL while they
compile, so a stuck compile does not slow the scheduler's Python code.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError

from radixserve.sampling.constrained.spec import GrammarError, GrammarSpec, clean_native_error

logger = logging.getLogger(__name__)

CompileFn = Callable[[GrammarSpec], object]


class CompileCache:
    """An LRU of compiled grammars plus the compiles in flight.

    Invariants: a spec is in at most one of ``_done`` and ``_running``; only successful compiles
    enter ``_done``; ``_done`` holds at most ``capacity`` entries (least recently used evicted);
    every future ``submit`` returns is settled by its deadline at the latest.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"cache_size must be at least 1, got {capacity}.")
        self.capacity = capacity
        self.hits = 0
        self.misses = 0
        self._done: OrderedDict[GrammarSpec, object] = OrderedDict()
        self._running: dict[GrammarSpec, Future[object]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._done)

    def __contains__(self, spec: object) -> bool:
        with self._lock:
            return spec in self._done

    def clear(self) -> None:
        """Forget every compiled grammar (compiles in flight still finish and are cached)."""
        with self._lock:
            self._done.clear()

    def submit(self, spec: GrammarSpec, compile_fn: CompileFn, timeout_s: float) -> Future[object]:
        """A future for ``spec``'s compiled grammar: already done on a cache hit; otherwise it
        settles with the result, the compile's GrammarError, or a GrammarError at the deadline.
        Concurrent requests for one spec share a single compile."""
        with self._lock:
            if spec in self._done:
                self._done.move_to_end(spec)
                self.hits += 1
                done: Future[object] = Future()
                done.set_result(self._done[spec])
                return done
            self.misses += 1
            job = self._running.get(spec)
            if job is None:
                job = Future()
                self._running[spec] = job
                worker = threading.Thread(
                    target=self._run,
                    args=(spec, compile_fn, job),
                    name=f"grammar-compile-{spec.kind}",
                    daemon=True,
                )
                worker.start()
        return _with_deadline(job, spec, timeout_s)

    def _run(self, spec: GrammarSpec, compile_fn: CompileFn, job: Future[object]) -> None:
        try:
            compiled = compile_fn(spec)
        except GrammarError as exc:
            self._finish(spec)
            job.set_exception(exc)
            return
        except Exception as exc:  # a library failing in a way it does not document
            logger.warning("Unexpected error compiling a %s grammar", spec.kind, exc_info=True)
            self._finish(spec)
            message = f"Cannot compile the {spec.param} grammar: {clean_native_error(exc)}"
            job.set_exception(GrammarError(message, spec.param))
            return
        self._finish(spec, compiled)
        job.set_result(compiled)

    def _finish(self, spec: GrammarSpec, compiled: object | None = None) -> None:
        with self._lock:
            self._running.pop(spec, None)
            if compiled is None:
                return
            self._done[spec] = compiled
            self._done.move_to_end(spec)
            while len(self._done) > self.capacity:
                self._done.popitem(last=False)


def _with_deadline(job: Future[object], spec: GrammarSpec, timeout_s: float) -> Future[object]:
    """A future mirroring ``job`` that fails with GrammarError if ``job`` is not done within
    ``timeout_s`` seconds."""
    out: Future[object] = Future()

    def expire() -> None:
        message = (
            f"The {spec.param} grammar took too long to compile (over {timeout_s:g} s); "
            "simplify it."
        )
        _settle(out, exc=GrammarError(message, spec.param))

    timer = threading.Timer(timeout_s, expire)
    timer.daemon = True
    timer.start()

    def relay(finished: Future[object]) -> None:
        timer.cancel()
        exc = finished.exception()
        if exc is not None:
            _settle(out, exc=exc)
        else:
            _settle(out, result=finished.result())

    job.add_done_callback(relay)
    return out


def _settle(
    future: Future[object], *, result: object = None, exc: BaseException | None = None
) -> None:
    # The deadline timer and the compile race to settle the same future; the loser is ignored.
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass
