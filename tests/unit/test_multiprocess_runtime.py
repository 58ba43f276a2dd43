"""The process runtime: scheduler and detokenizer in child processes, over ZMQ."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from radixserve import Engine
from tests.unit.tiny_model import write_tiny_llama

GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-mp"))


def engine_kwargs(tiny_dir: Path) -> dict[str, object]:
    return {
        "model_path": str(tiny_dir),
        "load_format": "dummy",
        "dtype": "float32",
        "skip_tokenizer_init": True,
        "max_total_tokens": 2048,
        "random_seed": 0,
    }


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_process_runtime_matches_thread_runtime(tiny_dir: Path) -> None:
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12] * 20]
    with Engine(runtime="thread", **engine_kwargs(tiny_dir)) as local:
        expected = [
            r["output_ids"] for r in local.generate(input_ids=prompts, sampling_params=GREEDY)
        ]
    with Engine(**engine_kwargs(tiny_dir)) as engine:
        got = [r["output_ids"] for r in engine.generate(input_ids=prompts, sampling_params=GREEDY)]
        assert got == expected
        info = engine.get_server_info()
        assert info["num_running_reqs"] == 0
        assert info["available_kv_tokens"] + info["cached_tokens"] == info["max_total_num_tokens"]
        # What the kernels run on, from the scheduler process (kernels/describe.py)
        assert info["kernels"] and "intel_amx" not in info["kernels"]
        assert engine.flush_cache() is True
        assert engine.get_server_info()["cached_tokens"] == 0


def test_child_death_fails_waiting_requests_and_marks_dead(tiny_dir: Path) -> None:
    engine = Engine(**engine_kwargs(tiny_dir))
    try:
        stream = engine.generate(
            input_ids=[5, 6, 7],
            sampling_params={"max_new_tokens": 1000, "ignore_eos": True},
            stream=True,
        )
        next(stream)
        scheduler = engine.runtime.processes[0]
        os.kill(scheduler.pid, signal.SIGKILL)
        chunks = list(stream)
        assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "abort"
        deadline = time.monotonic() + 5
        while engine.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not engine.is_alive()
        with pytest.raises(RuntimeError):
            engine.generate(input_ids=[5, 6], sampling_params=GREEDY)
    finally:
        engine.shutdown()


def test_children_exit_when_the_parent_is_killed(tiny_dir: Path, tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        from radixserve import Engine
        engine = Engine(**{engine_kwargs(tiny_dir)!r})
        print(" ".join(str(p.pid) for p in engine.runtime.processes), flush=True)
        time.sleep(600)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    try:
        line = parent.stdout.readline() if parent.stdout else ""
        child_pids = [int(p) for p in line.split()]
        assert len(child_pids) == 2 and all(pid_alive(p) for p in child_pids)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(pid_alive(p) for p in child_pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(pid_alive(p) for p in child_pids)
    finally:
        if parent.poll() is None:
            parent.kill()
