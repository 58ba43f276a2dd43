"""Compiling a request's grammar on the API side must not block the event loop (issue 11): a
plain request sent while a slow compile runs finishes before that compile does."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from radixserve import Engine
from radixserve.managers.tokenizer_manager import RequestError
from radixserve.sampling.constrained import GrammarError
from tests.unit.test_scheduler_engine import make_engine
from tests.unit.tiny_model import write_tiny_llama

# Long enough that a blocked loop is unmistakable, short enough not to hang the suite.
SLOW_COMPILE_S = 20.0


class SlowBackend:
    """A grammar backend whose compile takes until `release` is set (or SLOW_COMPILE_S), then
    refuses the grammar."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.started = threading.Event()
        self.release = threading.Event()

    def compile_async(self, spec: Any) -> Future[object]:
        future: Future[object] = Future()

        def run() -> None:
            self.started.set()
            self.release.wait(SLOW_COMPILE_S)
            self.events.append("compile finished")
            future.set_exception(GrammarError("too slow to be useful", spec.param))

        threading.Thread(target=run, daemon=True).start()
        return future

    def compile(self, spec: Any) -> object:
        return self.compile_async(spec).result()


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    eng = make_engine(write_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))
    yield eng
    eng.shutdown()


def test_a_slow_grammar_compile_does_not_stall_other_requests(engine: Engine) -> None:
    events: list[str] = []
    backend = SlowBackend(events)
    engine.tokenizer_manager._make_grammar_backend = lambda: backend
    engine.tokenizer_manager._grammar_backend = None
    plain = {"temperature": 0, "max_new_tokens": 2}

    async def scenario() -> None:
        constrained = asyncio.ensure_future(
            engine.async_generate(input_ids=[5, 6, 7], sampling_params={**plain, "regex": "a+"})
        )
        while not backend.started.is_set():  # the compile is running
            await asyncio.sleep(0.01)
        result = await engine.async_generate(input_ids=[5, 6, 7], sampling_params=plain)
        events.append("plain request finished")
        assert len(result["output_ids"]) == 2
        assert not constrained.done()
        backend.release.set()
        with pytest.raises(RequestError, match="too slow"):
            await constrained

    try:
        asyncio.run(scenario())
    finally:
        backend.release.set()
    assert events == ["plain request finished", "compile finished"]
