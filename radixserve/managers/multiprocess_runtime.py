"""The server's runtime: a scheduler process and a detokenizer process behind ZMQ.

    API process --PUSH--> scheduler --PUSH--> detokenizer --PUSH--> API process (reader thread)

With --tp-size N the scheduler is tensor-parallel rank 0 and N - 1 worker processes (ranks 1..N-1)
run the same forward steps, joined to it by torch.distributed (managers/tp_sync.py). With
--pp-size P there are N x P ranks: P pipeline stages of N tensor-parallel ranks each, rank 0
(the scheduler) being stage 0's first (model_executor/pipeline.py).

With --dp-size D there are D such schedulers (replicas: each its own model copy, KV pool and
radix cache, each with its own TP ranks and process group), all sending to the one detokenizer
(as in SGLang: its work is light, and a process fewer on a small machine). The data-parallel
controller (managers/dp_controller.py) picks each request's replica in this process, where
every request and output passes anyway; aborts follow the request to its replica, control
calls go to every replica and their answers are merged (managers/dp_info.py).

Children die with this process (even on SIGKILL). If a child dies, every waiting request
fails once with an error and `is_alive()` turns False (the server then answers /health with
503 and exits non-zero).
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import os
import queue
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq

from radixserve.distributed.launch import DistConfig, dist_config_for
from radixserve.distributed.nodes import node_layout
from radixserve.managers.detokenizer_process import run_detokenizer_process
from radixserve.managers.dp_controller import DataParallelController
from radixserve.managers.dp_info import merge_replica_infos
from radixserve.managers.process_utils import ipc_address
from radixserve.managers.request_router import RequestRouter, RuntimeDeadError, Sink
from radixserve.managers.scheduler_process import run_scheduler_process
from radixserve.messages import (
    AbortReq,
    FlushCacheReq,
    GetInfoReq,
    ReqOutput,
    SchedulerFailed,
    SchedulerReady,
    TokenizedGenerateReq,
)
from radixserve.utils.cpu_threads import ReplicaCpuLayout, plan_replicas

if TYPE_CHECKING:
    from radixserve.server_args import ServerArgs

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 1800.0
CALL_TIMEOUT_S = 60.0
WATCH_INTERVAL_S = 0.5
# When a TP rank dies during startup, rank 0 has usually hit the same error (or soon fails its
# next collective): wait up to this long for its message, which says why, before reporting only
# the exit code.
STARTUP_REASON_GRACE_S = 60.0


class EngineStartupError(RuntimeError):
    pass


def rank_label(server_args: ServerArgs, rank: int) -> str:
    """A rank process's name: tp-rank-R, or pp-S-tp-T-rank-R under pipeline parallelism."""
    if server_args.pp_size == 1:
        return f"tp-rank-{rank}"
    tp = server_args.tp_size
    return f"pp-{rank // tp}-tp-{rank % tp}-rank-{rank}"


class MultiProcessRuntime:
    def __init__(
        self,
        server_args: ServerArgs,
        on_death: Callable[[str], None] | None = None,
        on_spawned: Callable[[], None] | None = None,
    ) -> None:
        """`on_spawned` runs once the processes are started, before waiting for the model: the
        caller's own start-up work (a tokenizer, the HTTP stack) begins then, not before the
        spawn it would otherwise delay (it competes for this process's GIL)."""
        if server_args.node_rank > 0:
            # Such a node has no scheduler to talk to: `radixserve serve` runs its ranks.
            raise EngineStartupError(
                f"--node-rank {server_args.node_rank} runs only tensor-parallel ranks: start it "
                "with `radixserve serve`; an Engine (and the HTTP server) runs on node 0"
            )
        self.server_args = server_args
        self.on_death = on_death
        self.router = RequestRouter()
        self._dead_reason: str | None = None
        self._stopping = False
        self.dp_size = server_args.dp_size
        self.controller = DataParallelController(self.dp_size, server_args.load_balance_method)
        # --use-ray: the ranks become Ray actors (distributed/ray_launch.py); None otherwise.
        self._ray = self._connect_ray(server_args)
        self._folder = Path(tempfile.mkdtemp(prefix="radixserve-ipc-"))
        sched_ins = [ipc_address(self._folder, f"scheduler-{d}") for d in range(self.dp_size)]
        detok_in = ipc_address(self._folder, "detokenizer")
        api_in = ipc_address(self._folder, "api")
        self._ctx = zmq.Context()
        self._receiver = self._ctx.socket(zmq.PULL)
        self._receiver.bind(api_in)
        self._senders = []
        for address in sched_ins:
            sender = self._ctx.socket(zmq.PUSH)
            sender.connect(address)
            self._senders.append(sender)
        self._send_lock = threading.Lock()
        spawn = mp.get_context("spawn")
        pid = os.getpid()
        # Decided here, before any process changes its affinity: the children inherit ours.
        if server_args.nnodes > 1:
            # dp is 1 here (refused otherwise); this node runs rank 0 and its share of the
            # other ranks, the other nodes the rest (distributed/nodes.py).
            layout = node_layout(server_args)
            plans = [
                [
                    layout.cpu_plan(rank) if rank in layout.local_ranks else None
                    for rank in range(server_args.tp_size)
                ]
            ]
        else:
            plans = plan_replicas(self.dp_size, server_args.tp_size * server_args.pp_size)
        self.cpu_plan: Any = plans[0][0]
        if self.dp_size > 1:
            self.cpu_plan = ReplicaCpuLayout(tuple(tuple(p) for p in plans))
            logger.info("CPU cores: %s", self.cpu_plan.describe())
        self.processes = self._replica_processes(spawn, 0, sched_ins[0], detok_in, pid, plans[0])
        # Index 1 is the detokenizer (after replica 0's scheduler, before its TP ranks).
        self.processes.insert(
            1,
            spawn.Process(
                target=run_detokenizer_process,
                args=(server_args, detok_in, api_in, pid, plans[0][0]),
                name="radixserve-detokenizer",
                daemon=True,
            ),
        )
        for d in range(1, self.dp_size):
            self.processes += self._replica_processes(
                spawn, d, sched_ins[d], detok_in, pid, plans[d]
            )
        for proc in self.processes:
            proc.start()
        if on_spawned is not None:
            on_spawned()
        try:
            self.readies = self._wait_ready()
        except BaseException:
            self.shutdown()
            raise
        self.ready = self.readies[0]
        self._reader = threading.Thread(target=self._read, name="radixserve-reader", daemon=True)
        self._reader.start()
        self._watcher = threading.Thread(target=self._watch, name="radixserve-watch", daemon=True)
        self._watcher.start()

    # -- startup ----------------------------------------------------------------------------
    def _replica_processes(
        self, spawn: Any, dp_rank: int, sched_in: str, detok_in: str, pid: int, plans: list[Any]
    ) -> list[Any]:
        """Replica `dp_rank`'s scheduler (its TP rank 0) and its TP ranks above 0."""
        args = self.server_args
        dist = self._dist_config(args, dp_rank)
        suffix = f"-dp{dp_rank}" if self.dp_size > 1 else ""
        procs = [
            self._rank_process(
                spawn,
                run_scheduler_process,
                (args, sched_in, detok_in, pid, plans[0], dist, dp_rank if suffix else None),
                f"radixserve-scheduler{suffix}",
                rank0=True,
            )
        ]
        if dist is not None:
            # Imported only here: it imports torch, which an API process without TP ranks
            # never needs (spawn pickles the target by name, so naming it imports it).
            from radixserve.managers.tp_worker_process import run_tp_worker_process

            procs += [
                self._rank_process(
                    spawn,
                    run_tp_worker_process,
                    (args, rank, dist, pid, plans[rank]),
                    f"radixserve{suffix}-{rank_label(args, rank)}",
                )
                for rank in range(1, args.tp_size * args.pp_size)
                if plans[rank] is not None  # None: a rank another node runs (--nnodes)
            ]
        return procs

    def _rank_process(
        self, spawn: Any, target: Any, args: tuple[Any, ...], name: str, rank0: bool = False
    ) -> Any:
        """A rank's process: a multiprocessing child, or under --use-ray a Ray actor holding
        the same process (both take the parent pid as their 4th argument)."""
        if self._ray is None:
            return spawn.Process(target=target, args=args, name=name, daemon=True)
        from radixserve.distributed.ray_launch import RayRankProcess

        return RayRankProcess(target, args, name, pid_index=3, on_this_node=rank0)

    @staticmethod
    def _connect_ray(server_args: ServerArgs) -> Any:
        if not server_args.use_ray:
            return None
        from radixserve.distributed.ray_launch import connect

        try:
            return connect(server_args.tp_size * server_args.pp_size)
        except Exception as exc:
            raise EngineStartupError(f"--use-ray: could not get a Ray cluster: {exc}") from exc

    def _dist_config(self, server_args: ServerArgs, dp_rank: int = 0) -> DistConfig | None:
        config = self._group_config(server_args, dp_rank)
        ray = self._ray
        if (
            config is not None
            and ray is not None
            and ray.nodes > 1
            and not server_args.dist_init_addr
        ):
            # Ranks may land on other machines: meet at this machine's address (rank 0,
            # which hosts the rendezvous store, is pinned here), not 127.0.0.1.
            port = config.init_addr.rpartition(":")[2]
            config = dataclasses.replace(config, init_addr=f"{ray.node_ip}:{port}")
        return config

    @staticmethod
    def _group_config(server_args: ServerArgs, dp_rank: int = 0) -> DistConfig | None:
        world = server_args.tp_size * server_args.pp_size
        if world == 1:
            return None
        # Each replica is its own process group: its own rendezvous port (the given one plus
        # the replica's rank, as SGLang offsets its ports per dp rank) and its own GPUs.
        addr, port = server_args.dist_init_addr, server_args.nccl_port
        if addr and dp_rank:
            host, _, base = addr.rpartition(":")
            addr = f"{host}:{int(base) + dp_rank}"
        if port and dp_rank:
            port += dp_rank
        config = dist_config_for(world, server_args.device, addr, port, server_args.dist_timeout)
        return dataclasses.replace(config, base_gpu=dp_rank * world, pp_size=server_args.pp_size)

    def _startup_message(self, wait_s: float) -> SchedulerReady | None:
        """The scheduler's first message within `wait_s` (None if none came)."""
        if not self._receiver.poll(int(wait_s * 1000)):
            return None
        msg = self._receiver.recv_pyobj()
        if isinstance(msg, SchedulerFailed):
            raise EngineStartupError(f"The engine failed to start: {msg.message}")
        return msg if isinstance(msg, SchedulerReady) else None

    def _await_scheduler_reason(self) -> None:
        """A process died during startup. If it was a TP rank, rank 0 (the scheduler) has
        usually hit the same error or will see the lost rank: its message says why, so wait for
        it (raising it) while the scheduler lives, up to STARTUP_REASON_GRACE_S."""
        deadline = time.monotonic() + STARTUP_REASON_GRACE_S
        scheduler = self.processes[0]
        while time.monotonic() < deadline:
            self._startup_message(0.5)
            if not scheduler.is_alive():
                # What it sent just before exiting still has to pass the detokenizer, which can
                # take seconds on a loaded machine (a CI run lost the reason with 0.5 s).
                for _ in range(10):
                    self._startup_message(0.5)
                return

    def _wait_ready(self) -> list[SchedulerReady]:
        """Every replica's SchedulerReady (in arrival order: they are alike)."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        readies: list[SchedulerReady] = []
        while time.monotonic() < deadline:
            ready = self._startup_message(0.5)
            if ready is not None:
                readies.append(ready)
                if len(readies) == self.dp_size:
                    return readies
                continue
            for proc in self.processes:
                if not proc.is_alive():
                    self._await_scheduler_reason()
                    raise EngineStartupError(
                        f"{proc.name} exited with code {proc.exitcode} during startup"
                    )
        raise EngineStartupError(f"The engine did not start within {STARTUP_TIMEOUT_S:.0f} s")

    # -- API-side threads -------------------------------------------------------------------
    def _read(self) -> None:
        while not self._stopping:
            try:
                if not self._receiver.poll(200):
                    continue
                msg = self._receiver.recv_pyobj()
            except zmq.ZMQError:
                return
            self.router.on_message(msg)

    def _watch(self) -> None:
        while not self._stopping:
            time.sleep(WATCH_INTERVAL_S)
            dead = [proc for proc in self.processes if not proc.is_alive()]
            if dead and not self._stopping:
                # Name every dead child: when one TP rank dies, the others leave right after
                # it (their collectives fail), and the first in the list is not the cause.
                self._died(
                    ", ".join(f"{p.name} exited unexpectedly (code {p.exitcode})" for p in dead)
                )
                return

    def _died(self, reason: str) -> None:
        logger.error("%s", reason)
        self._dead_reason = reason
        self.router.fail_all(f"The engine stopped: {reason}", status_code=500)
        if self.on_death is not None:
            self.on_death(reason)

    # -- public -----------------------------------------------------------------------------
    def is_alive(self) -> bool:
        return self._dead_reason is None and all(p.is_alive() for p in self.processes)

    def _send(self, msg: Any, replica: int = 0) -> None:
        with self._send_lock:
            self._senders[replica].send_pyobj(msg)

    def submit(self, msg: TokenizedGenerateReq, sink: Sink) -> None:
        if not self.is_alive():
            raise RuntimeDeadError(self._dead_reason or "The engine is not running.")
        if self.dp_size == 1:
            self.router.register(msg.rid, sink)
            self._send(msg)
            return
        controller = self.controller

        def counted(out: ReqOutput) -> None:
            controller.on_output(out.rid, len(out.new_token_ids), out.finished is not None)
            sink(out)

        self.router.register(msg.rid, counted)  # a duplicate rid raises before routing
        session = msg.session_params or {}
        session_id = None if session.get("id") is None else str(session["id"])
        replica = controller.route(msg.rid, msg.input_ids, session_id)
        try:
            self._send(msg, replica)
        except BaseException:
            controller.forget(msg.rid)
            raise

    def abort(self, rid: str | None = None, abort_all: bool = False) -> None:
        if not self.is_alive():
            return
        replica = None if abort_all or rid is None else self.controller.replica_of(rid)
        if self.dp_size == 1 or replica is not None:
            self._send(AbortReq(rid=rid, abort_all=abort_all), replica or 0)
            return
        # abort_all, or a rid not in flight (already finished): every replica, harmlessly.
        for d in range(self.dp_size):
            self._send(AbortReq(rid=rid, abort_all=abort_all), d)

    def call(self, request: Any, timeout: float = CALL_TIMEOUT_S) -> Any:
        if not self.is_alive():
            raise RuntimeDeadError(self._dead_reason or "The engine is not running.")
        replies = []
        for d in range(self.dp_size):  # every replica at once, then the answers
            call, reply = self.router.new_call(request)
            self._send(call, d)
            replies.append(reply)
        deadline = time.monotonic() + timeout
        results = []
        for reply in replies:
            try:
                result = reply.get(timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:
                raise TimeoutError("The scheduler did not answer in time.") from None
            if isinstance(result, Exception):
                raise result
            results.append(result)
        if self.dp_size == 1:
            return results[0]
        if isinstance(request, FlushCacheReq):
            return all(results)
        if isinstance(request, GetInfoReq):
            return merge_replica_infos(
                [{**info, **self.controller.snapshot(d)} for d, info in enumerate(results)]
            )
        # Every other control call (pause, weights, memory, LoRA, ...) acts on every replica
        # alike; their answers match, so replica 0's stands for all.
        return results[0]

    def shutdown(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        reader = getattr(self, "_reader", None)
        if reader is not None:
            reader.join(timeout=2)
        for proc in self.processes:
            if proc.is_alive():
                proc.terminate()
        for proc in self.processes:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        if self._ray is not None:
            from radixserve.distributed.ray_launch import release

            release(self.processes, self._ray)
        self.router.fail_all("The engine is shutting down.", status_code=503)
        self._receiver.close(linger=0)
        for sender in self._senders:
            sender.close(linger=0)
        self._ctx.term()
        for item in self._folder.iterdir():
            item.unlink(missing_ok=True)
        self._folder.rmdir()
