"""Soak test: hold the server at about 70% of its measured capacity for a set time and watch
for leaks and bookkeeping errors (issue 11).

    python benchmarks/soak.py                          # starts a server, 1 hour
    python benchmarks/soak.py --duration 120 --report-dir /tmp/soak
    python benchmarks/soak.py --base-url http://127.0.0.1:30000 --server-pid 1234

Steps: start (or target) the server; measure its capacity with a closed loop of the mixed
workload (benchmarks/soak_workload.py) for --capacity-seconds; then send that mix as Poisson
arrivals at --load-fraction of the capacity for --duration seconds, with a greedy stream vs
non-stream equality probe every --equality-every seconds. Each --interval it records the
resident memory (RSS) and open file descriptors of every server process (the API process and
its children) and the p50/p99 latency of the requests that finished in it. At the end it waits
for the server to go idle (no request running or waiting, all KV free or cached), stops the
server it started with SIGTERM, and writes soak.md and soak.json to --report-dir.

Exit status 0 when every request ended exactly once, no token was lost or duplicated, every
equality probe matched and the server went idle; 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak_report import build_summary, write_reports
from soak_workload import PROMPTS, Outcome, equality_probe, pick_kind, run_one

REPO = Path(__file__).resolve().parents[1]
HANG_S = 300.0  # a client timeout that only guards against hangs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=3600.0, help="seconds of load (default 1 h)")
    p.add_argument("--base-url", help="target a running server instead of starting one")
    p.add_argument("--server-pid", type=int, help="its process id, for RSS and fd sampling")
    p.add_argument(
        "--server-args",
        # A KV pool the radix cache fills within the hour, so RSS must be seen to level off.
        default="--dtype float32 --enable-metrics --max-total-tokens 8192",
        help="arguments of the server this script starts (default: %(default)s)",
    )
    p.add_argument("--capacity-seconds", type=float, default=60.0)
    p.add_argument("--probe-concurrency", type=int, default=16)
    p.add_argument("--load-fraction", type=float, default=0.7)
    p.add_argument("--interval", type=float, default=60.0, help="seconds per report row")
    p.add_argument("--equality-every", type=float, default=30.0)
    p.add_argument("--max-outstanding", type=int, default=64, help="arrivals beyond are skipped")
    p.add_argument("--max-tokens", type=int, default=32, help="most tokens a choice asks for")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report-dir", type=Path, default=REPO / "soak-report")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


# -- the server --------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(extra: str, log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    command = [sys.executable, "-m", "radixserve", "serve", "--host", "127.0.0.1"]
    command += ["--port", str(port), *shlex.split(extra)]
    log = log_path.open("wb")
    proc = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(base: str, proc: subprocess.Popen[bytes] | None, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"the server at {base} was not ready after {timeout_s:.0f} s")


def sample_resources(pid: int | None) -> dict[str, Any]:
    """RSS and open fds of the server process and all its descendants."""
    if pid is None:
        return {"time": time.time(), "processes": 0, "rss_mib": None, "fds": None}
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {"time": time.time(), "processes": 0, "rss_mib": None, "fds": None}
    rss = fds = 0
    for proc in procs:
        try:
            rss += proc.memory_info().rss
            fds += proc.num_fds()
        except psutil.NoSuchProcess:
            continue
    return {"time": time.time(), "processes": len(procs), "rss_mib": rss / 2**20, "fds": fds}


async def wait_idle(client: httpx.AsyncClient, base: str, within_s: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + within_s
    while True:
        info = (await client.get(f"{base}/get_server_info")).json()
        free = info["available_kv_tokens"] + info.get("cached_tokens", 0)
        idle = (
            info["num_running_reqs"] == 0
            and info["num_waiting_reqs"] == 0
            and info.get("num_inflight_http_reqs", 0) == 0
            and free == info["max_total_num_tokens"]
        )
        if idle or time.monotonic() > deadline:
            return {"idle": idle, **{k: info.get(k) for k in _IDLE_KEYS}}
        await asyncio.sleep(0.2)


_IDLE_KEYS = (
    "num_running_reqs",
    "num_waiting_reqs",
    "num_inflight_http_reqs",
    "available_kv_tokens",
    "cached_tokens",
    "max_total_num_tokens",
)


# -- the load ----------------------------------------------------------------------------------
async def measure_capacity(
    client: httpx.AsyncClient,
    base: str,
    seconds: float,
    concurrency: int,
    seed: int,
    max_tokens: int,
) -> dict[str, Any]:
    """Completed requests per second of the mixed workload under a closed loop."""
    rng = random.Random(seed)
    done: list[Outcome] = []
    stop_at = time.monotonic() + seconds

    async def worker() -> None:
        while time.monotonic() < stop_at:
            done.append(await run_one(client, base, pick_kind(rng), rng, max_tokens))

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.monotonic() - started
    return {
        "requests": len(done),
        "seconds": elapsed,
        "rps": len(done) / elapsed,
        "concurrency": concurrency,
        "problems": sum(1 for o in done if o.problems),
    }


class Soak:
    def __init__(self, args: argparse.Namespace, base: str, pid: int | None) -> None:
        self.args = args
        self.base = base
        self.pid = pid
        self.rng = random.Random(args.seed + 1)
        self.outcomes: list[tuple[float, Outcome]] = []
        self.resources: list[dict[str, Any]] = []
        self.equality: list[dict[str, Any]] = []
        self.skipped = 0
        self.outstanding = 0

    async def _request(self, client: httpx.AsyncClient, kind: str) -> None:
        self.outstanding += 1
        try:
            rng = random.Random(self.rng.random())
            out = await run_one(client, self.base, kind, rng, self.args.max_tokens)
        finally:
            self.outstanding -= 1
        self.outcomes.append((time.time(), out))

    async def _probe(self, client: httpx.AsyncClient, i: int) -> None:
        try:
            self.equality.append(await equality_probe(client, self.base, PROMPTS[i % len(PROMPTS)]))
        except httpx.HTTPError as exc:
            self.equality.append({"time": time.time(), "equal": False, "error": repr(exc)[:200]})

    async def run(self, client: httpx.AsyncClient, rate: float) -> None:
        args = self.args
        tasks: set[asyncio.Task[None]] = set()
        start = time.monotonic()
        next_arrival = start
        next_probe = start + min(args.equality_every, args.duration / 2)
        next_sample = start + args.interval
        probes = 0
        bar = tqdm(total=int(args.duration), unit="s", disable=args.no_progress, desc="soak")
        self.resources.append(sample_resources(self.pid))
        while (now := time.monotonic()) < start + args.duration:
            if now >= next_arrival:
                next_arrival += self.rng.expovariate(rate)
                if self.outstanding >= args.max_outstanding:
                    self.skipped += 1
                else:
                    kind = pick_kind(self.rng)
                    task = asyncio.ensure_future(self._request(client, kind))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            if now >= next_probe:
                next_probe += args.equality_every
                task = asyncio.ensure_future(self._probe(client, probes))
                probes += 1
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if now >= next_sample:
                next_sample += args.interval
                self.resources.append(sample_resources(self.pid))
            bar.n = min(int(now - start), int(args.duration))
            bar.set_postfix(done=len(self.outcomes), open=self.outstanding, refresh=False)
            bar.refresh()
            await asyncio.sleep(
                max(0.0, min(next_arrival, next_probe, next_sample) - time.monotonic())
            )
        bar.n = int(args.duration)
        bar.close()
        if tasks:
            await asyncio.gather(*tasks)


def stop_server(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


async def soak_main(args: argparse.Namespace) -> int:
    args.report_dir.mkdir(parents=True, exist_ok=True)
    proc = None
    base, pid = args.base_url, args.server_pid
    if base is None:
        proc, base = start_server(args.server_args, args.report_dir / "server.log")
        pid = proc.pid
    started = time.time()
    try:
        wait_ready(base, proc)
        limits = httpx.Limits(max_connections=args.max_outstanding * 2 + 8)
        async with httpx.AsyncClient(timeout=HANG_S, limits=limits) as client:
            capacity = await measure_capacity(
                client,
                base,
                args.capacity_seconds,
                args.probe_concurrency,
                args.seed,
                args.max_tokens,
            )
            idle_before = await wait_idle(client, base)
            rate = max(capacity["rps"] * args.load_fraction, 0.05)
            soak = Soak(args, base, pid)
            load_started = time.time()
            await soak.run(client, rate)
            load_ended = time.time()
            idle_after = await wait_idle(client, base)
            idle_after["drain_s"] = time.time() - load_ended
            soak.resources.append(sample_resources(pid))
    finally:
        exit_code = stop_server(proc) if proc is not None else None
    summary = build_summary(
        args=vars(args)
        | {
            "report_dir": str(args.report_dir),
            "base_url": base,
            "started_server": proc is not None,
        },
        started=started,
        load_started=load_started,
        capacity=capacity,
        rate=rate,
        soak=soak,
        idle_before=idle_before,
        idle_after=idle_after,
        server_exit_code=exit_code,
    )
    write_reports(summary, args.report_dir)
    print(f"report: {args.report_dir / 'soak.md'}  verdict: {summary['verdict']}")
    return 0 if summary["passed"] else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TQDM_MININTERVAL", "1")
    return asyncio.run(soak_main(args))


if __name__ == "__main__":
    raise SystemExit(main())
