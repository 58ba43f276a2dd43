"""Who runs on which CPU cores.

The scheduler's compute threads own the cores: its process is pinned to them and PyTorch (and
radixserve's C++ kernels, which share PyTorch's OpenMP pool) run one thread per core. The API
and detokenizer processes do light Python work; they run a single PyTorch thread (an idle
OpenMP team there would only compete with the compute threads) and, where the machine has
cores outside the compute set, stay on those.

SGLang's SGLANG_CPU_OMP_THREADS_BIND chooses the compute cores ("0-31|32-63": one core list
per tensor-parallel rank); it also pins each compute thread to its own core. Without it, the
cores this process may use are split into one contiguous share per tensor-parallel rank (all
of them with --tp-size 1), each rank's process is kept on its share, and its threads are left
to the OS to place within it (on a machine shared with other work, a pinned thread cannot
move off a busy core).

With --dp-size D every data-parallel replica has its own --tp-size T ranks: the D x T ranks
split the cores (replica-major: replica 0's ranks first), and SGLANG_CPU_OMP_THREADS_BIND
lists D x T core sets in that order. Replicas compute at the same time, so sharing cores would
only make their threads fight.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

logger = logging.getLogger(__name__)

BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"


@dataclass(frozen=True)
class CpuPlan:
    compute: tuple[int, ...]  # the scheduler's cores, one compute thread each
    light: tuple[int, ...]  # where the API and detokenizer run: spare cores, else all
    pin_threads: bool  # one compute thread per core (SGLANG_CPU_OMP_THREADS_BIND given)

    def describe(self) -> str:
        spare = not set(self.light) & set(self.compute)
        where = "spare cores " + _format(self.light) if spare else "shared"
        pinned = ", one thread pinned per core" if self.pin_threads else ""
        return (
            f"{len(self.compute)} compute threads on CPUs {_format(self.compute)}{pinned}; "
            f"API and detokenizer: 1 thread each ({where})"
        )


def _format(cpus: Sequence[int]) -> str:
    return ",".join(str(c) for c in cpus)


def parse_cpu_list(text: str) -> list[int]:
    """'0-3,6' -> [0, 1, 2, 3, 6]; ValueError on anything else."""
    cpus: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low, sep, high = part.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ValueError(f"not a CPU list: {text!r} (expected e.g. '0-3,6')")
        first, last = int(low), int(high) if sep else int(low)
        if last < first:
            raise ValueError(f"not a CPU list: {text!r} ({part} runs backwards)")
        cpus.extend(range(first, last + 1))
    if not cpus:
        raise ValueError(f"not a CPU list: {text!r} (no CPUs)")
    return sorted(set(cpus))


def _allowed_cpus() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))  # no affinity API (macOS): every CPU


def _set_affinity(cpus: Sequence[int]) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


def split_cores(usable: Sequence[int], tp_size: int) -> list[tuple[int, ...]]:
    """Contiguous, near-equal shares of `usable`, one per tensor-parallel rank (threads per rank
    = cores / tp). With fewer cores than ranks, ranks share cores round-robin, one each."""
    if tp_size <= len(usable):
        base, extra = divmod(len(usable), tp_size)
        shares, start = [], 0
        for rank in range(tp_size):
            size = base + (1 if rank < extra else 0)
            shares.append(tuple(usable[start : start + size]))
            start += size
        return shares
    return [(usable[rank % len(usable)],) for rank in range(tp_size)]


def _rank_name(index: int, tp_size: int, dp_size: int) -> str:
    if dp_size == 1:
        return f"TP rank {index}"
    return f"rank {index} (data-parallel replica {index // tp_size}, TP rank {index % tp_size})"


def _rank_sets(
    spec: str, count: int, usable: Sequence[int], tp_size: int = 1, dp_size: int = 1
) -> list[tuple[int, ...]]:
    ranks = spec.split("|")
    if len(ranks) < count:
        missing = _rank_name(len(ranks), tp_size, dp_size)
        raise ValueError(
            f"{BIND_ENV}={spec!r} lists {len(ranks)} core sets, none for {missing}: "
            "give one core list per rank, separated by '|'"
        )
    sets = [tuple(parse_cpu_list(text)) for text in ranks[:count]]
    outside = sorted({c for cpus in sets for c in cpus if c not in usable})
    if outside:
        raise ValueError(
            f"{BIND_ENV} names CPUs {_format(outside)}, which this process may not use "
            f"(allowed: {_format(usable)})"
        )
    return sets


def plan_cpus(
    tp_rank: int = 0,
    env: Mapping[str, str] | None = None,
    allowed: Sequence[int] | None = None,
    tp_size: int = 1,
    dp_rank: int = 0,
    dp_size: int = 1,
) -> CpuPlan:
    """The compute and light CPU sets for the scheduler (or TP worker) of `tp_rank` in
    data-parallel replica `dp_rank`."""
    env = os.environ if env is None else env
    if allowed is None:
        allowed = _allowed_cpus()
    usable = sorted(allowed)
    spec = env.get(BIND_ENV, "").strip()
    index = dp_rank * tp_size + tp_rank
    if spec:
        sets = _rank_sets(spec, max(tp_size * dp_size, index + 1), usable, tp_size, dp_size)
    else:
        sets = split_cores(usable, tp_size * dp_size)
    compute = sets[index]
    taken = {c for cpus in sets for c in cpus}
    spare = tuple(c for c in usable if c not in taken)
    return CpuPlan(tuple(compute), spare or tuple(usable), pin_threads=bool(spec))


@dataclass(frozen=True)
class ReplicaCpuLayout:
    """Every data-parallel replica's rank plans (replica-major); what the API process and the
    startup banner need from them. Duck-types CpuPlan's `light` and `describe`."""

    plans: tuple[tuple[CpuPlan, ...], ...]  # [dp_rank][tp_rank]

    @property
    def light(self) -> tuple[int, ...]:
        return self.plans[0][0].light

    def describe(self) -> str:
        def ranks(plans: tuple[CpuPlan, ...]) -> str:
            return " + ".join(_format(p.compute) for p in plans)

        replicas = "; ".join(
            f"replica {d}: CPUs {ranks(plans)} ({sum(len(p.compute) for p in plans)} threads)"
            for d, plans in enumerate(self.plans)
        )
        first = self.plans[0][0]
        spare = not set(first.light) & {c for ps in self.plans for p in ps for c in p.compute}
        where = "spare cores " + _format(first.light) if spare else "shared"
        shared = self._shared_cores()
        warn = f" (replicas share CPUs {_format(shared)}: fewer cores than ranks)" if shared else ""
        return (
            f"{len(self.plans)} data-parallel replicas, {replicas}{warn}; "
            f"API and detokenizer: 1 thread each ({where})"
        )

    def _shared_cores(self) -> list[int]:
        seen: dict[int, int] = {}
        for d, plans in enumerate(self.plans):
            for cpu in {c for p in plans for c in p.compute}:
                seen.setdefault(cpu, d)
                if seen[cpu] != d:
                    seen[cpu] = -1
        return sorted(c for c, owner in seen.items() if owner == -1)


def plan_replicas(
    dp_size: int, tp_size: int, env: Mapping[str, str] | None = None
) -> list[list[CpuPlan]]:
    """Every rank's plan, [dp_rank][tp_rank], decided once in the parent (before any child
    changes its affinity)."""
    return [
        [plan_cpus(r, env, tp_size=tp_size, dp_rank=d, dp_size=dp_size) for r in range(tp_size)]
        for d in range(dp_size)
    ]


def claim_compute_cores(
    plan: CpuPlan, bind_threads: Callable[[list[int]], bool] | None = None
) -> None:
    """In the scheduler process: pin it to the compute cores, one PyTorch thread per core.
    `bind_threads` (the C++ kernels' ops.bind_threads, handed in by the caller: utils does
    not import kernels) pins each OpenMP thread to one core when the plan asks for it."""
    import torch

    _set_affinity(plan.compute)
    torch.set_num_threads(len(plan.compute))
    if plan.pin_threads and (bind_threads is None or not bind_threads(list(plan.compute))):
        logger.warning(
            "%s: pinning each compute thread needs the C++ kernels; the process is pinned "
            "to the cores but its threads may move between them",
            BIND_ENV,
        )
    logger.info("CPU threads: %s", plan.describe())


# How much lower start-up threads beside the model load run (added to their nice value).
START_UP_NICENESS = 10


def yield_cpu_to_the_model() -> None:
    """Lower the calling thread's CPU priority (Linux: a thread has a nice value of its own):
    for start-up work in the API process (the tokenizer, the HTTP stack) that is needed only
    once the model is loaded, so the scheduler process's start, the longest path to a ready
    server, gets the cores first. The thread ends with its work; nothing else is affected."""
    tid = threading.get_native_id()
    try:
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, current + START_UP_NICENESS))
    except (AttributeError, OSError):
        pass  # not Linux, or not allowed: it runs at the usual priority


def run_light(plan: CpuPlan) -> None:
    """In the API and detokenizer processes: one PyTorch thread, off the compute cores when
    there are cores to spare. Does not import torch (a process that never needs it stays
    without it); if torch comes later, OMP_NUM_THREADS gives it one thread."""
    import sys

    os.environ["OMP_NUM_THREADS"] = "1"
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
    _set_affinity(plan.light)
