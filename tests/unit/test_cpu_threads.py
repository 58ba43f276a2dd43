"""CPU ownership: the scheduler's compute cores (SGLANG_CPU_OMP_THREADS_BIND or all usable CPUs)
and the light processes' cores, and pinning that really changes the threads' affinity."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from radixserve.utils.cpu_threads import BIND_ENV, CpuPlan, parse_cpu_list, plan_cpus


def test_parse_cpu_list() -> None:
    assert parse_cpu_list("0-3,6") == [0, 1, 2, 3, 6]
    assert parse_cpu_list(" 2 , 1,1 ") == [1, 2]
    for bad in ("", "a-b", "3-1", "1-", "-2"):
        with pytest.raises(ValueError, match="not a CPU list"):
            parse_cpu_list(bad)


def test_default_plan_uses_every_usable_cpu_and_shares_them() -> None:
    plan = plan_cpus(env={}, allowed=[0, 1])
    assert plan == CpuPlan(compute=(0, 1), light=(0, 1), pin_threads=False)
    assert "2 compute threads on CPUs 0,1" in plan.describe()


def test_bind_env_picks_the_rank_cores_and_leaves_the_rest_to_light_processes() -> None:
    env = {BIND_ENV: "0-3|4-7"}
    assert plan_cpus(0, env, allowed=range(10)) == CpuPlan((0, 1, 2, 3), (4, 5, 6, 7, 8, 9), True)
    assert plan_cpus(1, env, allowed=range(10)).compute == (4, 5, 6, 7)
    with pytest.raises(ValueError, match="none for TP rank 2"):
        plan_cpus(2, env, allowed=range(10))
    with pytest.raises(ValueError, match="may not use"):
        plan_cpus(0, {BIND_ENV: "0-3"}, allowed=[0, 1])


def _run(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no affinity API")
def test_claim_and_light_set_threads_and_affinity() -> None:
    """In child processes (affinity and thread counts are process-wide)."""
    out = _run(
        """
        import os, torch
        from radixserve.utils.cpu_threads import CpuPlan, claim_compute_cores, run_light
        cpu = sorted(os.sched_getaffinity(0))[0]
        claim_compute_cores(CpuPlan((cpu,), (cpu,), pin_threads=False))
        assert torch.get_num_threads() == 1 and os.sched_getaffinity(0) == {cpu}
        run_light(CpuPlan((cpu,), (cpu,), pin_threads=False))
        print("ok", torch.get_num_threads())
        """
    )
    assert out.split() == ["ok", "1"]


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs two CPUs",
)
def test_bound_compute_threads_each_run_on_one_cpu() -> None:
    from radixserve.kernels import build

    if build.load_extension() is None:
        pytest.skip("C++ kernels unavailable: threads cannot be pinned one by one")
    out = _run(
        """
        import json, os
        from radixserve.kernels import ops
        cpus = sorted(os.sched_getaffinity(0))[:2]
        assert ops.bind_threads(cpus)
        masks = set()
        for tid in os.listdir("/proc/self/task"):
            masks.add(frozenset(os.sched_getaffinity(int(tid))))
        print(json.dumps([sorted(sorted(m) for m in masks if len(m) == 1), cpus]))
        """
    )
    singles, cpus = json.loads(out)
    assert singles == [[c] for c in cpus]


def test_start_up_threads_yield_the_cpu_and_only_themselves() -> None:
    import os
    import threading

    from radixserve.utils.cpu_threads import START_UP_NICENESS, yield_cpu_to_the_model

    if not hasattr(os, "getpriority"):
        pytest.skip("no per-thread priorities here")
    seen: list[int] = []

    def work() -> None:
        yield_cpu_to_the_model()
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert seen == [min(19, before + START_UP_NICENESS)]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before
