"""An HTTP app over a real engine on the tiny random Llama (thread runtime, token ids only),
for route tests that need the scheduler's real behaviour rather than a fake."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from radixserve import Engine
from radixserve.entrypoints.http_server import create_app
from tests.unit.tiny_model import make_tiny_engine


def tiny_engine(model_dir: Path, **kwargs: Any) -> Engine:
    """make_tiny_engine, without the server warm-up (these tests drive the routes themselves)."""
    engine: Engine = make_tiny_engine(model_dir, **{"skip_server_warmup": True, **kwargs})
    return engine


@contextmanager
def tiny_client(model_dir: Path, **kwargs: Any) -> Iterator[tuple[TestClient, Engine]]:
    engine = tiny_engine(model_dir, **kwargs)
    try:
        app = create_app(engine, engine.server_args)
        with TestClient(app, raise_server_exceptions=False) as client:
            app.state.ctx.state.ready = True
            yield client, engine
    finally:
        engine.shutdown()


def assert_kv_idle(engine: Engine) -> None:
    """No request holds KV: everything is free or in the prefix cache."""
    info = engine.get_server_info()
    assert info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0
    assert info["available_kv_tokens"] + info["cached_tokens"] == info["max_total_num_tokens"]
