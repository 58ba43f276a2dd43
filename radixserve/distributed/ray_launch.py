"""--use-ray: the scheduler (rank 0) and the tensor/pipeline-parallel ranks run as Ray actors
instead of multiprocessing children of the API process, so Ray decides on which machine of a
cluster each rank runs.

Each rank actor holds one process: it spawns exactly the process the multiprocessing launch
spawns (run_scheduler_process or run_tp_worker_process, same arguments) and waits for it. So
everything between the ranks is unchanged: tensors go over torch.distributed (gloo) at the
rendezvous address, and rank 0 talks to the API process and the detokenizer over ZMQ IPC,
which is why rank 0's actor is pinned to this machine. Ray only places and supervises.

Cluster: `ray.init(address="auto")` joins a running cluster (RAY_ADDRESS, or one started with
`ray start` on this machine); when RAY_ADDRESS is unset and there is none, a local one is
started for this server (logical CPUs = the rank count, a small object store, no dashboard)
and stopped at shutdown.

Lifetime: a rank process dies with its actor (PR_SET_PDEATHSIG), and the actors are owned by
this process, so Ray removes them when it exits. A rank that ends, or an actor that dies, shows
as a dead "process" to the runtime's watcher, which takes the server down as for any child.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

# Ray's lower bound for the object store; the launch passes only arguments through it.
LOCAL_OBJECT_STORE_BYTES = 100 * 1024 * 1024
# A rank stopped with SIGTERM gets this long before SIGKILL (as MultiProcessRuntime.shutdown).
STOP_GRACE_S = 10.0
# exitcode reported for a rank whose actor died (no exit status of its own is known).
ACTOR_DIED = -1


@dataclass(frozen=True)
class RayCluster:
    """The connection this server made; `started` when it started the local cluster itself."""

    started: bool
    node_ip: str
    nodes: int
    # False when the program had called ray.init itself (an Engine in a Ray program): its
    # connection is left alone.
    connected_here: bool = True

    def shutdown(self) -> None:
        import ray

        # Stops the local cluster's processes (GCS, raylet, workers) when ray.init started
        # them; otherwise only disconnects, and the actors this process owned are removed.
        if self.connected_here:
            ray.shutdown()


def connect(num_ranks: int) -> RayCluster:
    """Join the running cluster, or start a local one sized for `num_ranks` rank actors."""
    import ray

    # Rank actors import the radixserve this server runs (its folder first on their path:
    # the same path on every machine of the cluster, or an installed radixserve there).
    runtime_env = {"env_vars": {"PYTHONPATH": _python_path()}}
    connected_here = not ray.is_initialized()  # else: an Engine in a Ray program
    started = False
    if connected_here:
        try:
            ray.init(address="auto", runtime_env=runtime_env, logging_level=logging.WARNING)
        except ConnectionError:
            if os.environ.get("RAY_ADDRESS"):
                raise  # the cluster asked for is unreachable: not a reason to start another
            ray.init(
                address="local",  # a new cluster, even if a stale one is recorded on disk
                num_cpus=num_ranks,
                num_gpus=0,
                object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                include_dashboard=False,
                runtime_env=runtime_env,
                logging_level=logging.WARNING,
            )
            started = True
    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    free = ray.available_resources().get("CPU", 0.0)
    cluster = RayCluster(started, ray.util.get_node_ip_address(), nodes, connected_here)
    logger.info(
        "Ray: %s cluster, %d node(s), %g CPUs free; this node %s",
        "started a local" if started else "joined the running",
        nodes,
        free,
        cluster.node_ip,
    )
    if free < num_ranks:
        cluster.shutdown()
        raise RuntimeError(
            f"the Ray cluster has {free:g} free CPUs, and each of the {num_ranks} "
            "ranks asks for one; add nodes or CPUs, or use fewer ranks"
        )
    return cluster


def _python_path() -> str:
    # The folder holding the radixserve package (this file is radixserve/distributed/...).
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rest = os.environ.get("PYTHONPATH")
    return root if not rest else f"{root}{os.pathsep}{rest}"


@functools.cache
def _rank_actor_class() -> Any:
    """The actor class, built on first use (importing this module needs no Ray), once: Ray
    exports a class to the cluster each time one is made."""
    import ray

    # Two calls at once: `run` waits on the process while `stop` may arrive.
    @ray.remote(max_concurrency=2)
    class RankActor:
        def __init__(self) -> None:
            self.proc: Any = None

        def run(self, target: Any, args: tuple[Any, ...], pid_index: int, name: str) -> int:
            """Spawn the rank process and wait for it; its exit code."""
            import multiprocessing as mp

            args = list(args)
            args[pid_index] = os.getpid()  # it dies with this actor, not the API process
            self.proc = mp.get_context("spawn").Process(
                target=target, args=tuple(args), name=name, daemon=True
            )
            self.proc.start()
            self.proc.join()
            return int(self.proc.exitcode)

        def stop(self, grace_s: float) -> None:
            proc = self.proc
            if proc is None or not proc.is_alive():
                return
            proc.terminate()
            proc.join(grace_s)
            if proc.is_alive():
                proc.kill()
                proc.join(5)

    return RankActor


class RayRankProcess:
    """One rank as a Ray actor, with the part of multiprocessing.Process's interface that
    MultiProcessRuntime uses (start, is_alive, exitcode, terminate, join, kill, name)."""

    def __init__(
        self,
        target: Any,
        args: tuple[Any, ...],
        name: str,
        pid_index: int,
        on_this_node: bool,
    ) -> None:
        self.target = target
        self.args = args
        self.name = name
        self.pid_index = pid_index
        self.on_this_node = on_this_node
        self.actor: Any = None
        self.done: Any = None
        self._exitcode: int | None = None

    def start(self) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options: dict[str, Any] = {"num_cpus": 1}
        if self.on_this_node:
            # Rank 0 binds and connects ZMQ IPC sockets with this process: same machine.
            node = ray.get_runtime_context().get_node_id()
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        self.actor = _rank_actor_class().options(**options).remote()
        self.done = self.actor.run.remote(self.target, self.args, self.pid_index, self.name)

    def _finished(self, timeout: float | None = 0) -> bool:
        import ray

        if self._exitcode is not None:
            return True
        ready, _ = ray.wait([self.done], timeout=timeout)
        if not ready:
            return False
        try:
            self._exitcode = int(ray.get(ready[0]))
        except ray.exceptions.RayError as exc:
            logger.error("%s: its Ray actor died: %s", self.name, str(exc).splitlines()[0])
            self._exitcode = ACTOR_DIED
        return True

    def is_alive(self) -> bool:
        return self.done is not None and not self._finished()

    @property
    def exitcode(self) -> int | None:
        return self._exitcode if self.done is not None and self._finished() else None

    def terminate(self) -> None:
        if self.actor is not None:
            self.actor.stop.remote(STOP_GRACE_S)

    def join(self, timeout: float | None = None) -> None:
        if self.done is not None:
            self._finished(timeout=timeout)

    def kill(self) -> None:
        import ray

        if self.actor is not None:
            ray.kill(self.actor, no_restart=True)


def release(ranks: list[Any], cluster: RayCluster) -> None:
    """After the rank processes ended (or were stopped): remove their actors, then leave (or
    stop, when this server started it) the cluster, so no Ray process of ours stays behind."""
    import ray

    for rank in ranks:
        if isinstance(rank, RayRankProcess) and rank.actor is not None:
            try:
                ray.kill(rank.actor, no_restart=True)
            except Exception as exc:  # already gone with its node: nothing left to remove
                logger.debug("ray.kill(%s): %s", rank.name, exc)
    cluster.shutdown()
