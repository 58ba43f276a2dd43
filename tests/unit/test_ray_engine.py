"""--use-ray through the Engine API (slow, needs ray): pipeline parallelism with its ranks as
Ray actors gives the same greedy tokens as one rank in-process; a rank actor removed with
ray.kill takes the engine down (requests fail, is_alive() turns False)."""

from __future__ import annotations

import importlib.util
import os
import time
import uuid
from pathlib import Path

import pytest

from radixserve import Engine
from tests.helpers.tiny_models import make_tiny_checkpoint
from tests.unit.test_tp_engine import DIST_TIMEOUT_S, engine_kwargs, greedy

pytestmark = [
    pytest.mark.slow,  # a local Ray cluster's start takes tens of seconds on 2 cores
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray"),
]


@pytest.fixture
def ray_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """A local cluster of the engine's own, in a private temp dir (none to join by accident)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", f"/tmp/rs-ray-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    yield
    import shutil

    shutil.rmtree(os.environ["RAY_TMPDIR"], ignore_errors=True)


def test_pp2_as_ray_actors_equals_one_rank_and_dies_with_an_actor(
    tmp_path: Path, ray_env: None
) -> None:
    import ray

    make_tiny_checkpoint(tmp_path, "llama", num_hidden_layers=3)
    kwargs = engine_kwargs(tmp_path)
    with Engine(runtime="thread", **kwargs) as single:
        expected = greedy(single)
    engine = Engine(pp_size=2, use_ray=True, dist_timeout=DIST_TIMEOUT_S, **kwargs)
    try:
        names = [p.name for p in engine.runtime.processes]
        assert names == [
            "radixserve-scheduler",
            "radixserve-detokenizer",
            "radixserve-pp-1-tp-0-rank-1",
        ]
        assert greedy(engine) == expected
        stage1 = engine.runtime.processes[2]
        ray.kill(stage1.actor, no_restart=True)
        deadline = time.monotonic() + 60
        while engine.runtime.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not engine.runtime.is_alive()
        assert stage1.exitcode == -1  # an actor's death, not an exit status
        with pytest.raises(Exception, match="engine"):
            greedy(engine)
    finally:
        engine.shutdown()
    assert not ray.is_initialized()  # the local cluster it started is gone with it
