"""The server's runtime: a scheduler process and a detokenizer process behind ZMQ.

    API process --PUSH--> scheduler --PUSH--> detokenizer --PUSH--> API process (reader thread)

With --tp-size N the scheduler is tensor-parallel rank 0 and N - 1 worker processes (ranks 1..N-1)
run the same forward steps, joined to it by torch.distributed (managers/tp_sync.py).

Children die with this process (even on SIGKILL). If a child dies, every waiting request
fails once with an error and `is_alive()` turns False (the server then answers /health with
503 and exits non-zero).
"""

from __future__ import annotations

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
from radixserve.managers.process_utils import ipc_address
from radixserve.managers.request_router import RequestRouter, RuntimeDeadError, Sink
from radixserve.managers.scheduler_process import run_scheduler_process
from radixserve.managers.tp_worker_process import run_tp_worker_process
from radixserve.messages import AbortReq, SchedulerFailed, SchedulerReady, TokenizedGenerateReq

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


class MultiProcessRuntime:
    def __init__(
        self, server_args: ServerArgs, on_death: Callable[[str], None] | None = None
    ) -> None:
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
        self._folder = Path(tempfile.mkdtemp(prefix="radixserve-ipc-"))
        sched_in = ipc_address(self._folder, "scheduler")
        detok_in = ipc_address(self._folder, "detokenizer")
        api_in = ipc_address(self._folder, "api")
        self._ctx = zmq.Context()
        self._receiver = self._ctx.socket(zmq.PULL)
        self._receiver.bind(api_in)
        self._sender = self._ctx.socket(zmq.PUSH)
        self._sender.connect(sched_in)
        self._send_lock = threading.Lock()
        spawn = mp.get_context("spawn")
        pid = os.getpid()
        # This node's ranks (all of them on one node; rank 0 and its node's share with --nnodes).
        layout = node_layout(server_args)
        # Decided here, before any process changes its affinity: the children inherit ours.
        plans = {rank: layout.cpu_plan(rank) for rank in layout.local_ranks}
        self.cpu_plan = plans[0]
        dist = self._dist_config(server_args)
        self.processes = [
            spawn.Process(
                target=run_scheduler_process,
                args=(server_args, sched_in, detok_in, pid, self.cpu_plan, dist),
                name="radixserve-scheduler",
                daemon=True,
            ),
            spawn.Process(
                target=run_detokenizer_process,
                args=(server_args, detok_in, api_in, pid, self.cpu_plan),
                name="radixserve-detokenizer",
                daemon=True,
            ),
        ]
        if dist is not None:
            self.processes += [
                spawn.Process(
                    target=run_tp_worker_process,
                    args=(server_args, rank, dist, pid, plans[rank]),
                    name=f"radixserve-tp-rank-{rank}",
                    daemon=True,
                )
                for rank in layout.local_ranks
                if rank != 0
            ]
        for proc in self.processes:
            proc.start()
        try:
            self.ready = self._wait_ready()
        except BaseException:
            self.shutdown()
            raise
        self._reader = threading.Thread(target=self._read, name="radixserve-reader", daemon=True)
        self._reader.start()
        self._watcher = threading.Thread(target=self._watch, name="radixserve-watch", daemon=True)
        self._watcher.start()

    # -- startup ----------------------------------------------------------------------------
    @staticmethod
    def _dist_config(server_args: ServerArgs) -> DistConfig | None:
        if server_args.tp_size == 1:
            return None
        return dist_config_for(
            server_args.tp_size,
            server_args.device,
            server_args.dist_init_addr,
            server_args.nccl_port,
            server_args.dist_timeout,
        )

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

    def _wait_ready(self) -> SchedulerReady:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            ready = self._startup_message(0.5)
            if ready is not None:
                return ready
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

    def _send(self, msg: Any) -> None:
        with self._send_lock:
            self._sender.send_pyobj(msg)

    def submit(self, msg: TokenizedGenerateReq, sink: Sink) -> None:
        if not self.is_alive():
            raise RuntimeDeadError(self._dead_reason or "The engine is not running.")
        self.router.register(msg.rid, sink)
        self._send(msg)

    def abort(self, rid: str | None = None, abort_all: bool = False) -> None:
        if self.is_alive():
            self._send(AbortReq(rid=rid, abort_all=abort_all))

    def call(self, request: Any, timeout: float = CALL_TIMEOUT_S) -> Any:
        if not self.is_alive():
            raise RuntimeDeadError(self._dead_reason or "The engine is not running.")
        call, reply = self.router.new_call(request)
        self._send(call)
        try:
            result = reply.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError("The scheduler did not answer in time.") from None
        if isinstance(result, Exception):
            raise result
        return result

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
        self.router.fail_all("The engine is shutting down.", status_code=503)
        self._receiver.close(linger=0)
        self._sender.close(linger=0)
        self._ctx.term()
        for item in self._folder.iterdir():
            item.unlink(missing_ok=True)
        self._folder.rmdir()
