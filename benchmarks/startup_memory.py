"""Start-up time and idle memory of radixserve against llama-server on one GGUF file.

    .venv/bin/python benchmarks/startup_memory.py --model-path FILE.gguf \\
        --llama-server ~/.cache/radixserve-bench/<build>/bin/llama-server --rounds 3 \\
        [--tree before=/path/to/an/older/checkout --tree after=.]

Each round starts each radixserve tree (default: this checkout), then llama-server
(interleaved, so machine noise hits all alike), times each from the spawn until /health
answers 200 (polled every 50 ms: compare.py polls every 0.5 s, too coarse for a ~1 s start),
waits for the processes to settle, then sums RSS and PSS over the server's process tree.
Medians are printed with every round's figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import free_port, process_tree_memory
from serve_command import radixserve_command

REPO = Path(__file__).resolve().parent.parent
POLL_S = 0.05
READY_TIMEOUT_S = 300.0
SETTLE_S = 3.0  # after /health: the API's warm-up trim and the children's idle trims
# llama-server as compare.py starts it for concurrency 1: a 128-token prompt, 64 out, + 128.
LLAMA_CTX = 320


@dataclass
class Sample:
    engine: str
    startup_s: float
    rss_mib: float
    pss_mib: float
    processes: int
    # Each process's RSS (MiB), largest first, labelled by its command line's end.
    each_rss_mib: list[tuple[str, float]]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def run_once(engine: str, command: list[str], port: int, log: Path, tree: Path = REPO) -> Sample:
    # `python -m radixserve` imports from its working directory first: the tree to measure.
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with log.open("ab") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=tree, env=env
        )
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not _healthy(f"http://127.0.0.1:{port}/health"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{engine} did not start; see {log}")
            time.sleep(POLL_S)
        startup = time.perf_counter() - start
        time.sleep(SETTLE_S)
        mem = process_tree_memory(proc.pid)
        return Sample(
            engine,
            startup,
            mem["rss_mib"],
            mem["pss_mib"],
            int(mem["processes"]),
            each_process_rss(proc.pid),
        )
    finally:
        # The server's own session: this ends exactly it and its children.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def each_process_rss(pid: int) -> list[tuple[str, float]]:
    import psutil

    root = psutil.Process(pid)
    found = []
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            line = " ".join(proc.cmdline())
            label = "resource_tracker" if "resource_tracker" in line else line[-40:]
            if proc.pid == pid:
                label = "main"
            elif "spawn_main" in line:
                label = "child"
            found.append((label, round(proc.memory_info().rss / 2**20, 1)))
    return sorted(found, key=lambda item: -item[1])


def llama_command(binary: Path, model: Path, port: int, threads: int) -> list[str]:
    return [
        str(binary),
        "-m",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--parallel",
        "1",
        "-c",
        str(LLAMA_CTX),
        "--cont-batching",
        "-t",
        str(threads),
        "-tb",
        str(threads),
    ]


def summarize(samples: list[Sample]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for engine in dict.fromkeys(s.engine for s in samples):
        mine = [s for s in samples if s.engine == engine]
        out[engine] = {
            "startup_s": statistics.median(s.startup_s for s in mine),
            "rss_mib": statistics.median(s.rss_mib for s in mine),
            "pss_mib": statistics.median(s.pss_mib for s in mine),
            "processes": float(mine[0].processes),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", type=Path, required=True)
    parser.add_argument("--llama-server", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--radixserve-args", default="", help="extra serve options, one string")
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="LABEL=PATH",
        help="a radixserve checkout to start (repeatable; default: this one, as radixserve)",
    )
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/radixserve-startup"))
    parser.add_argument("--json", type=Path, default=None, help="also write the samples here")
    args = parser.parse_args()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    trees = [tuple(t.split("=", 1)) for t in args.tree] or [("radixserve", str(REPO))]
    samples: list[Sample] = []
    for i in range(args.rounds):
        for label, tree in trees:
            port = free_port()
            command = radixserve_command(args.model_path, port, args.radixserve_args.split())
            log = args.log_dir / f"{label}-{i}.log"
            samples.append(run_once(label, command, port, log, Path(tree).resolve()))
            print(json.dumps(asdict(samples[-1])), flush=True)
        if args.llama_server is not None:
            port = free_port()
            command = llama_command(args.llama_server, args.model_path, port, args.threads)
            log = args.log_dir / f"llama-server-{i}.log"
            samples.append(run_once("llama-server", command, port, log))
            print(json.dumps(asdict(samples[-1])), flush=True)
    summary = summarize(samples)
    print(json.dumps(summary, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps({"samples": [asdict(s) for s in samples], **summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
