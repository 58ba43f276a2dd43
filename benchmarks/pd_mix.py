"""Prefill/decode disaggregation against one server and two servers, same cores, mixed load.

    LD_LIBRARY_PATH=... .venv/bin/python benchmarks/pd_mix.py            # all three, once
    .venv/bin/python benchmarks/pd_mix.py --configs single router2 --repeats 2 --duration 60

Configurations (each started fresh, measured, stopped; `--repeats` cycles through them again,
so that a burst of other work on a shared machine does not land on one configuration only):
  single   one server whose compute threads own both cores (`--cores 0,1`)
  pd       a prefill server on the first core and a decode server on the second, KV moved by
           Mooncake over TCP, sglang-router in PD mode in front
  router2  two ordinary servers, one core each, sglang-router (regular mode) in front
Cores are given with SGLANG_CPU_OMP_THREADS_BIND, as radixserve pins them (utils/cpu_threads.py),
or with taskset and unpinned threads under --no-pin.

The workload (benchmarks/pd_mix_workload.py): short requests (64-token prompts, 64 new tokens)
at a fixed rate (one every 2 s), and a long-prompt request (1500 tokens, 16 new) every 10 s, streamed on
/generate with radixserve's benchmark client (radixserve/benchmarking/backends.py). The report
gives TTFT and TPOT (median, p90) for short and long requests apart, throughput, and the
1-minute load average before and after each run. Mooncake's engine loads libibverbs even over
TCP: where it is not installed system-wide, point LD_LIBRARY_PATH at a copy.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pd_mix_workload import (
    LONG,
    Arrival,
    MixConfig,
    RunSummary,
    markdown_table,
    schedule,
    summarize_run,
)

from radixserve.benchmarking.backends import NATIVE, RequestSpec, send_request
from radixserve.benchmarking.metrics import RequestOutput
from radixserve.benchmarking.report import append_jsonl
from radixserve.utils.cpu_threads import BIND_ENV, parse_cpu_list

logger = logging.getLogger("pd_mix")
REPO = Path(__file__).resolve().parents[1]
CONFIGS = ("single", "pd", "router2")
READY_S = 600.0
REQUEST_TIMEOUT_S = 600.0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    p.add_argument("--repeats", type=int, default=1, help="cycles through --configs")
    p.add_argument("--cores", default="0,1", help="two CPUs: the first for prefill / worker 1")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals per run")
    p.add_argument("--short-rate", type=float, default=0.5, help="short requests per second")
    p.add_argument("--short-input", type=int, default=64)
    p.add_argument("--short-output", type=int, default=64)
    p.add_argument("--long-interval", type=float, default=10.0, help="seconds between long ones")
    p.add_argument("--long-input", type=int, default=1500)
    p.add_argument("--long-output", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--server-args", default="", help="extra `radixserve serve` options, quoted")
    p.add_argument(
        "--transfer-backend", default="mooncake_tcp", choices=("mooncake", "mooncake_tcp")
    )
    p.add_argument("--router-policy", default="round_robin")
    p.add_argument(
        "--no-pin",
        action="store_true",
        help="confine each server with taskset instead of SGLANG_CPU_OMP_THREADS_BIND:\n"
        "its compute threads are not pinned one per core, so the OS may move them off a core\n"
        "that other work keeps busy",
    )
    p.add_argument("--log-dir", type=Path, default=None, help="process logs (default: a temp dir)")
    p.add_argument("--output-file", type=Path, default=None, help="append one JSON line per run")
    p.add_argument("--progress-every", type=float, default=10.0, help="seconds; 0 for none")
    args = p.parse_args(argv)
    try:
        cores = parse_cpu_list(args.cores)
    except ValueError:
        p.error(f"--cores {args.cores!r}: expected two CPU ids such as 0,1")
    if len(cores) != 2 or len(set(cores)) != 2:
        p.error(f"--cores {args.cores!r}: expected exactly two different CPU ids, e.g. 0,1")
    args.cores = cores
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    try:
        args.mix = MixConfig(
            duration_s=args.duration,
            short_rate=args.short_rate,
            short_input=args.short_input,
            short_output=args.short_output,
            long_interval_s=args.long_interval,
            long_input=args.long_input,
            long_output=args.long_output,
            seed=args.seed,
        )
    except ValueError as exc:
        p.error(str(exc))
    return args


# -- processes ---------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Proc:
    """A child in its own process group, so that stopping it stops its children too."""

    def __init__(self, name: str, command: list[str], log_dir: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("wb")
        logger.info("starting %s: %s", name, shlex.join(command))
        self.proc = subprocess.Popen(
            command,
            cwd=REPO,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            start_new_session=True,
        )

    def tail(self, chars: int = 3000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"{self.name} exited with {self.proc.returncode}; its log ({self.log_path}):\n"
                + self.tail()
            )

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        self._log.close()


class Stack:
    """The processes of one configuration and the URL that the load goes to."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[Proc] = []
        self.url = ""

    def server(
        self, name: str, cpus: Sequence[int], extra: Sequence[str], server_args: str, pin: bool
    ) -> str:
        port = free_port()
        command = [sys.executable, "-m", "radixserve", "serve", "--host", "127.0.0.1"]
        command += ["--port", str(port), *shlex.split(server_args), *extra]
        cpu_list = ",".join(str(c) for c in cpus)
        env: dict[str, str] = {}
        if pin:
            # radixserve's own placement: one compute thread pinned per listed core.
            env[BIND_ENV] = cpu_list
        else:
            # The whole process tree confined to the cores, threads free to move within them.
            command = ["taskset", "-c", cpu_list, *command]
        self.procs.append(Proc(name, command, self.log_dir, env))
        return f"http://127.0.0.1:{port}"

    def router(self, name: str, args: Sequence[str]) -> str:
        port = free_port()
        command = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1"]
        command += ["--port", str(port), *args, "--log-level", "warn"]
        command += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
        self.procs.append(Proc(name, command, self.log_dir, {}))
        return f"http://127.0.0.1:{port}"

    def check_alive(self) -> None:
        for proc in self.procs:
            proc.check_alive()

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


def wait_health(stack: Stack, url: str) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        stack.check_alive()
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} was not healthy after {READY_S:.0f} s")


def wait_generate(stack: Stack, url: str) -> None:
    """Ready when a one-token /generate goes through (a router is up before its workers are)."""
    body = {"text": "Hi", "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        stack.check_alive()
        try:
            if httpx.post(f"{url}/generate", json=body, timeout=60).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer /generate after {READY_S:.0f} s")


def start_config(name: str, args: argparse.Namespace, stack: Stack) -> None:
    first, second = args.cores
    pin = not args.no_pin
    if name == "single":
        url = stack.server("single", (first, second), (), args.server_args, pin)
        wait_health(stack, url)
    elif name == "router2":
        urls = [
            stack.server(f"worker{i}", (cpu,), (), args.server_args, pin)
            for i, cpu in enumerate((first, second))
        ]
        for u in urls:
            wait_health(stack, u)
        url = stack.router("router", ["--worker-urls", *urls, "--policy", args.router_policy])
    elif name == "pd":
        bootstrap = free_port()
        backend = ("--disaggregation-transfer-backend", args.transfer_backend)
        prefill = stack.server(
            "prefill",
            (first,),
            (*backend, "--disaggregation-mode", "prefill"),
            args.server_args + f" --disaggregation-bootstrap-port {bootstrap}",
            pin,
        )
        decode = stack.server(
            "decode",
            (second,),
            (*backend, "--disaggregation-mode", "decode"),
            args.server_args,
            pin,
        )
        wait_health(stack, prefill)
        wait_health(stack, decode)
        url = stack.router(
            "router",
            ["--pd-disaggregation", "--prefill", prefill, str(bootstrap), "--decode", decode]
            + ["--policy", args.router_policy],
        )
    else:
        raise ValueError(f"unknown configuration {name!r}")
    wait_generate(stack, url)
    stack.url = url


def mooncake_loads() -> bool:
    code = "from mooncake.engine import TransferEngine"
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


# -- the load ----------------------------------------------------------------------------------
def _spec(url: str, arrival: Arrival) -> RequestSpec:
    return RequestSpec(
        api_url=f"{url}/generate",
        kind=NATIVE,
        model=None,
        prompt=list(arrival.prompt),
        prompt_len=len(arrival.prompt),
        output_len=arrival.output_len,
    )


def _no_tokenizer(text: str) -> int:
    # radixserve reports completion_tokens with every streamed chunk: this is only reached by
    # a stream that ended without output (an error event); _check_output marks it failed.
    return 0


def _check_output(out: RequestOutput) -> RequestOutput:
    if out.success and out.output_len == 0:
        out.success = False
        out.error = out.error or "the stream ended without output tokens"
    return out


async def drive(
    url: str, arrivals: Sequence[Arrival], progress_every: float, label: str
) -> tuple[list[RequestOutput], float]:
    """Send each request at its arrival time (never waiting for earlier answers); the outputs
    in arrival order and the seconds from the first send to the last answer."""
    limits = httpx.Limits(max_connections=len(arrivals) + 8)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        start = time.perf_counter()
        tasks: list[asyncio.Task[RequestOutput]] = []

        async def report() -> None:
            while True:
                await asyncio.sleep(progress_every)
                done = [t.result() for t in tasks if t.done()]
                failed = sum(not o.success for o in done)
                logger.info(
                    "%s: %.0f s, %d/%d sent, %d answered, %d failed",
                    label,
                    time.perf_counter() - start,
                    len(tasks),
                    len(arrivals),
                    len(done),
                    failed,
                )

        reporter = asyncio.create_task(report()) if progress_every > 0 else None
        try:
            for arrival in arrivals:
                delay = start + arrival.at_s - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(
                    asyncio.create_task(send_request(client, _spec(url, arrival), _no_tokenizer))
                )
            outputs = [_check_output(o) for o in await asyncio.gather(*tasks)]
        finally:
            if reporter is not None:
                reporter.cancel()
    end = max((o.start_time + o.latency for o in outputs if o.success), default=start)
    return outputs, end - start


def warm_up(url: str, mix: MixConfig) -> None:
    """A few requests of both kinds first (first calls of a shape pay one-off costs), with
    another seed so that the measured prompts find nothing in the radix cache."""
    warm = dataclasses.replace(
        mix,
        duration_s=4.0,
        short_rate=1.0,
        long_interval_s=2.0,
        long_offset_s=0.5,
        seed=mix.seed + 10_000,
    )
    outputs, _ = asyncio.run(drive(url, schedule(warm), 0, "warm-up"))
    failed = [o.error for o in outputs if not o.success]
    if failed:
        raise RuntimeError(f"warm-up requests failed: {failed[0]}")


def run_one(name: str, repeat: int, args: argparse.Namespace, log_dir: Path) -> RunSummary:
    stack = Stack(log_dir / f"{name}-{repeat}")
    stack.log_dir.mkdir(parents=True, exist_ok=True)
    try:
        began = time.monotonic()
        start_config(name, args, stack)
        logger.info("%s: ready in %.0f s; warming up", name, time.monotonic() - began)
        warm_up(stack.url, args.mix)
        arrivals = schedule(args.mix)
        longs = sum(a.kind == LONG for a in arrivals)
        load_before = os.getloadavg()[0]
        logger.info(
            "%s (run %d): %d short + %d long requests over %.0f s, load %.2f",
            name,
            repeat,
            len(arrivals) - longs,
            longs,
            args.mix.duration_s,
            load_before,
        )
        outputs, duration = asyncio.run(drive(stack.url, arrivals, args.progress_every, name))
        load_after = os.getloadavg()[0]
        stack.check_alive()
        errors = [o.error for o in outputs if not o.success]
        if errors:
            logger.warning("%s: %d requests failed, first: %s", name, len(errors), errors[0])
        return summarize_run(name, repeat, arrivals, outputs, duration, (load_before, load_after))
    finally:
        stack.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    if "pd" in args.configs and not mooncake_loads():
        print(
            "pd_mix: configuration pd needs Mooncake's transfer engine, which does not load: "
            "pip install 'radixserve[disaggregation]' and libibverbs1 (or set LD_LIBRARY_PATH "
            "to a copy), or leave pd out of --configs",
            file=sys.stderr,
        )
        return 2
    # SIGTERM ends the run through the finally blocks, which stop every child.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="pd-mix-"))
    logger.info("process logs under %s", log_dir)
    placement = "taskset, threads unpinned" if args.no_pin else f"{BIND_ENV}, threads pinned"
    logger.info("cores %s (%s); workload %s", args.cores, placement, args.mix)
    runs: list[RunSummary] = []
    for repeat in range(1, args.repeats + 1):
        for name in args.configs:
            summary = run_one(name, repeat, args, log_dir)
            runs.append(summary)
            if args.output_file is not None:
                append_jsonl(
                    args.output_file,
                    {**dataclasses.asdict(summary), "mix": dataclasses.asdict(args.mix)},
                )
            print(markdown_table([summary]).splitlines()[-1], flush=True)
    print()
    print(markdown_table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
