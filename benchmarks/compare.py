"""Side by side: radixserve vs llama.cpp's llama-server vs HF transformers, on the same workloads.

    .venv/bin/python benchmarks/compare.py            # the full comparison (long)
    .venv/bin/python benchmarks/compare.py --quick    # small; proves the pipeline (~25 min on 2 busy cores)
    .venv/bin/python benchmarks/compare.py --concurrencies 1 8 --workloads random \\
        --radixserve-args '--dtype bfloat16'
    .venv/bin/python benchmarks/compare.py --workloads random --shapes 128:64 512:128 2048:32
    .venv/bin/python benchmarks/compare.py --render-only ~/.cache/radixserve-bench/runs/<time>/record.json

One command from a fresh clone: builds llama-server/llama-bench if missing
(benchmarks/build_llama_cpp.sh; source from the llama-cpp-python sdist), starts the servers on
free localhost ports, drives them with radixserve's SGLang-compatible load generator
(`python -m radixserve.bench_serving`), runs HF transformers with static batches
(benchmarks/hf_static.py), and writes docs/performance.md (tables, machine, versions, ratios)
and docs/performance.png. For each workload, random shape (--shapes) and concurrency the engines
run back to back, so machine noise hits them alike; each shape is a section of its own. Text
after '## Notes' in an existing performance.md is kept. --model-path takes a .gguf or a Hugging
Face (safetensors) folder; llama.cpp reads GGUF files only, so on a folder it is skipped with a
note in the report.

The anchors (llama.cpp, transformers, matplotlib) are benchmark-only: see
benchmarks/requirements-compare.txt; radixserve itself depends on none of them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_report as report
from serve_command import radixserve_command

REPO = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO / "benchmarks" / "build_llama_cpp.sh"
HF_RUNNER = REPO / "benchmarks" / "hf_static.py"
REQUIREMENTS = REPO / "benchmarks" / "requirements-compare.txt"
DEFAULT_CACHE = Path(
    os.environ.get("RADIXSERVE_BENCH_CACHE", Path.home() / ".cache" / "radixserve-bench")
)
ENGINES = (report.RADIXSERVE, report.LLAMA_CPP, report.HF_BF16, report.HF_FP32)
WORKLOADS = (report.RANDOM, report.SHARED_PREFIX)
CPU_FLAGS_OF_INTEREST = (
    "avx2",
    "avx512f",
    "avx512_bf16",
    "avx512_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
READY_TIMEOUT_S = 600.0


# ----------------------------------------------------------------------------- arguments


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny run: concurrency 1 and 8, 16 prompts, shape 64:64, small shared prefix",
    )
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument(
        "--concurrencies",
        type=int,
        nargs="+",
        default=None,
        help="default 1 8 32 64 (--quick: 1 8)",
    )
    parser.add_argument(
        "--num-prompts",
        type=int,
        default=None,
        help="per run; default max(2 x concurrency, 8) (--quick: 16)",
    )
    parser.add_argument(
        "--shapes",
        nargs="+",
        type=parse_shape,
        default=None,
        metavar="IN:OUT",
        help="random workload shapes, prompt tokens:output tokens (e.g. 128:64 512:128 2048:32), "
        "each a report section of its own; default: one shape, from --input-len and "
        "--output-len, which are refused together with --shapes",
    )
    parser.add_argument(
        "--input-len",
        type=int,
        default=None,
        help="one random shape's prompt tokens; default 128 (--quick: 64)",
    )
    parser.add_argument(
        "--output-len",
        type=int,
        default=None,
        help="one random shape's output tokens; default 128 (--quick: 64)",
    )
    parser.add_argument(
        "--hf-batches",
        type=int,
        default=1,
        help="static batches per HF run (each of `concurrency` prompts; static batching is "
        "deterministic, so one batch measures it; HF bf16 is slow on CPUs without bf16 units)",
    )
    parser.add_argument("--seed", type=int, default=1)
    shared = parser.add_argument_group("shared-prefix workload (generated-shared-prefix)")
    shared.add_argument("--gsp-num-groups", type=int, default=None, help="default 16 (--quick: 4)")
    shared.add_argument(
        "--gsp-prompts-per-group", type=int, default=None, help="default 4 (--quick: 2)"
    )
    shared.add_argument(
        "--gsp-system-prompt-len", type=int, default=None, help="default 1024 (--quick: 256)"
    )
    shared.add_argument(
        "--gsp-question-len", type=int, default=None, help="default 64 (--quick: 32)"
    )
    shared.add_argument("--gsp-output-len", type=int, default=None, help="default 16 (--quick: 8)")
    shared.add_argument("--gsp-concurrency", type=int, default=None, help="default 8 (--quick: 4)")
    parser.add_argument(
        "--radixserve-args",
        default="",
        help="extra `radixserve serve` arguments, e.g. '--dtype bfloat16'",
    )
    parser.add_argument(
        "--model-path",
        type=Path,
        default=None,
        help="the model: a .gguf file, or a Hugging Face folder (safetensors), which llama.cpp "
        "cannot read: then llama.cpp and llama-bench are skipped, with a note in the report "
        "(default: radixserve's default model)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="llama.cpp threads (-t); default: all CPUs",
    )
    parser.add_argument(
        "--llama-server", type=Path, default=None, help="skip the build: this binary"
    )
    parser.add_argument(
        "--llama-bench", type=Path, default=None, help="skip the build: this binary"
    )
    parser.add_argument(
        "--skip-llama-bench", action="store_true", help="no llama-bench pp512/tg128"
    )
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "performance.md")
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        help="the throughput figure (default: --output's name with .png, so a report written "
        "elsewhere does not replace docs/performance.png)",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="raw results, server logs (default: the cache dir's runs/<time>)",
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per benchmark run")
    parser.add_argument(
        "--render-only",
        type=Path,
        default=None,
        metavar="RECORD_JSON",
        help="measure nothing: rewrite --output/--plot from a run dir's record.json",
    )
    return parser


def parse_shape(text: str) -> report.Shape:
    """IN:OUT, two positive token counts."""
    input_text, sep, output_text = text.partition(":")
    try:
        shape = report.Shape(int(input_text), int(output_text))
    except ValueError:
        shape = None
    if not sep or shape is None or min(shape) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not IN:OUT (prompt tokens:output tokens, e.g. 512:128)"
        )
    return shape


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The parsed command line, after the checks that span several options."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.shapes is not None:
        if args.input_len is not None or args.output_len is not None:
            parser.error(
                "--shapes names every random shape; drop --input-len/--output-len "
                "(or pass them alone for one shape)"
            )
        repeated = sorted({str(s) for s in args.shapes if args.shapes.count(s) > 1})
        if repeated:
            parser.error(f"--shapes lists {', '.join(repeated)} more than once")
    if args.plot is None:
        args.plot = args.output.with_suffix(".png")
    return args


@dataclass
class Settings:
    workloads: list[str]
    engines: list[str]
    concurrencies: list[int]
    num_prompts: int | None
    shapes: list[report.Shape]
    seed: int
    gsp: dict[str, int]
    radixserve_args: list[str]
    threads: int
    quick: bool
    hf_batches: int = 1


def _pick(value: Any, quick: bool, full: Any, small: Any) -> Any:
    if value is not None:
        return value
    return small if quick else full


def random_shapes(args: argparse.Namespace, quick: bool) -> list[report.Shape]:
    """--shapes, or the one shape that --input-len and --output-len (or their defaults) name."""
    if args.shapes:
        return list(args.shapes)
    input_len = _pick(args.input_len, quick, 128, 64)
    return [report.Shape(input_len, _pick(args.output_len, quick, 128, 64))]


def resolve_settings(args: argparse.Namespace) -> Settings:
    quick = bool(args.quick)
    gsp = {
        "num_groups": _pick(args.gsp_num_groups, quick, 16, 4),
        "prompts_per_group": _pick(args.gsp_prompts_per_group, quick, 4, 2),
        "system_prompt_len": _pick(args.gsp_system_prompt_len, quick, 1024, 256),
        "question_len": _pick(args.gsp_question_len, quick, 64, 32),
        "output_len": _pick(args.gsp_output_len, quick, 16, 8),
        "concurrency": _pick(args.gsp_concurrency, quick, 8, 4),
    }
    return Settings(
        workloads=list(args.workloads),
        engines=list(args.engines),
        concurrencies=list(_pick(args.concurrencies, quick, [1, 8, 32, 64], [1, 8])),
        num_prompts=_pick(args.num_prompts, quick, None, 16),
        shapes=random_shapes(args, quick),
        seed=args.seed,
        gsp=gsp,
        radixserve_args=shlex.split(args.radixserve_args),
        threads=args.threads,
        quick=quick,
        hf_batches=args.hf_batches,
    )


def num_prompts_for(settings: Settings, concurrency: int) -> int:
    if settings.num_prompts is not None:
        return settings.num_prompts
    return max(2 * concurrency, 8)


# ----------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Job:
    workload: str
    engine: str
    concurrency: int
    num_prompts: int
    expected_output_len: int
    shape: report.Shape | None = None  # a random job's; None for shared-prefix

    @property
    def label(self) -> str:
        workload = self.workload if self.shape is None else f"{self.workload} {self.shape}"
        return f"{workload} c={self.concurrency} {self.engine}"

    def random_shape(self) -> report.Shape:
        if self.shape is None:
            raise ValueError(f"{self.label} has no random shape")
        return self.shape


def plan_jobs(settings: Settings) -> list[Job]:
    """Interleaved: for each workload, shape and concurrency, every engine back to back."""
    jobs: list[Job] = []
    if report.RANDOM in settings.workloads:
        for shape in settings.shapes:
            for concurrency in settings.concurrencies:
                for engine in settings.engines:
                    prompts = (
                        settings.hf_batches * concurrency
                        if engine in (report.HF_BF16, report.HF_FP32)
                        else num_prompts_for(settings, concurrency)
                    )
                    jobs.append(
                        Job(report.RANDOM, engine, concurrency, prompts, shape.output_len, shape)
                    )
    if report.SHARED_PREFIX in settings.workloads:
        gsp = settings.gsp
        prompts = gsp["num_groups"] * gsp["prompts_per_group"]
        engines = [e for e in settings.engines if e in (report.RADIXSERVE, report.LLAMA_CPP)]
        if report.RADIXSERVE in engines:
            engines.insert(1, report.RADIXSERVE_NO_RADIX)
        for engine in engines:
            jobs.append(
                Job(report.SHARED_PREFIX, engine, gsp["concurrency"], prompts, gsp["output_len"])
            )
    return jobs


def llama_ctx_per_slot(settings: Settings, workload: str) -> int:
    """Context per llama-server slot: the longest prompt + output, with room for BOS/rounding.
    For the random workload that is the largest shape's, so llama-server runs with the same
    context (and KV memory) in every shape."""
    if workload == report.SHARED_PREFIX:
        gsp = settings.gsp
        tokens = gsp["system_prompt_len"] + gsp["question_len"] + gsp["output_len"]
    else:
        tokens = max(shape.input_len + shape.output_len for shape in settings.shapes)
    # Room for BOS and for llama.cpp tokenizing the random text a little longer.
    return tokens + 128


# Seeds of the n-th random shape are n strides apart: distinct while concurrencies stay below
# 1000, and the first shape keeps the seeds of runs made before --shapes.
SHAPE_SEED_STRIDE = 1_000_000


def seed_for(settings: Settings, job: Job) -> int:
    """One seed per workload, shape and concurrency: the same prompts for every engine, new ones
    for each concurrency and shape (a prefix cache must not profit from an earlier run's prompts,
    and one seed would make a shorter shape's prompts the prefixes of a longer one's)."""
    shape_index = settings.shapes.index(job.shape) if job.shape is not None else 0
    return settings.seed * 1000 + job.concurrency + SHAPE_SEED_STRIDE * shape_index


# ----------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_ok(url: str, timeout: float = 2.0) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


@dataclass
class Server:
    name: str
    command: list[str]
    port: int
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    startup_s: float = 0.0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        start = time.perf_counter()
        # A session of its own: stop() ends exactly this server and its children.
        self.process = subprocess.Popen(
            self.command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO
        )
        log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - start

    def _wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.process.returncode} while starting; "
                    f"log: {self.log_path}\n{tail(self.log_path)}"
                )
            if http_ok(f"{self.base_url}/health"):
                return
            time.sleep(0.5)
        raise RuntimeError(
            f"{self.name} not healthy after {READY_TIMEOUT_S:.0f}s; log: {self.log_path}"
        )

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def process_tree_memory(pid: int) -> dict[str, float]:
    """RSS and PSS (MiB) summed over a process and all its descendants, and their count."""
    import psutil

    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    rss = pss = 0.0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            info = proc.memory_full_info()
            rss += info.rss
            pss += getattr(info, "pss", info.rss)
    return {"rss_mib": rss / 2**20, "pss_mib": pss / 2**20, "processes": float(len(procs))}


def process_tree_cpu(pid: int, seconds: float = 3.0) -> float:
    """CPU use (percent of one core) of a process tree over a few idle seconds."""
    import psutil

    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.cpu_percent(None)
    time.sleep(seconds)
    total = 0.0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            total += proc.cpu_percent(None)
    return total


class ServerPool:
    """Starts servers when a job needs them; one llama-server at a time (its --parallel is the
    concurrency), the radixserve servers kept until the end."""

    def __init__(
        self,
        model: Path,
        gguf: Path | None,
        llama_server: Path | None,
        settings: Settings,
        run_dir: Path,
    ):
        self.model = model  # what radixserve serves and the load generator tokenizes with
        self.gguf = gguf  # the model's GGUF file, for llama-server; None when it has none
        self.llama_server = llama_server
        self.settings = settings
        self.run_dir = run_dir
        self.radixserve: dict[str, Server] = {}
        self.llama: Server | None = None
        self.llama_key: tuple[int, int] | None = None
        self.memory: list[tuple[str, str]] = []
        self.failed: dict[str, str] = {}  # engine -> why its server did not start

    def radixserve_server(self, engine: str) -> Server:
        if engine in self.failed:
            raise RuntimeError(self.failed[engine])
        if engine not in self.radixserve:
            extra = ["--disable-radix-cache"] if engine == report.RADIXSERVE_NO_RADIX else []
            port = free_port()
            command = radixserve_command(self.model, port, [*self.settings.radixserve_args, *extra])
            slug = "radixserve-no-radix" if extra else "radixserve"
            server = Server(engine, command, port, self.run_dir / f"{slug}.log")
            try:
                server.start()
            except RuntimeError as exc:
                self.failed[engine] = f"{engine} did not start: {str(exc).splitlines()[0]}"
                raise RuntimeError(self.failed[engine]) from None
            self.radixserve[engine] = server
            if not extra:
                self._record_radixserve_memory(server)
        return self.radixserve[engine]

    def _record_radixserve_memory(self, server: Server) -> None:
        assert server.process is not None
        time.sleep(2.0)  # let the children settle after /health turns green
        mem = process_tree_memory(server.process.pid)
        cpu = process_tree_cpu(server.process.pid)
        self.memory += [
            ("radixserve startup (s)", f"{server.startup_s:.1f}"),
            (
                "radixserve idle RSS, all processes (MiB)",
                f"{mem['rss_mib']:.0f} ({mem['processes']:.0f} processes; PSS {mem['pss_mib']:.0f})",
            ),
            ("radixserve idle CPU (% of one core)", f"{cpu:.0f}"),
        ]

    def llama_cpp_server(self, concurrency: int, ctx_per_slot: int) -> Server:
        key = (concurrency, ctx_per_slot)
        if self.llama is not None and self.llama_key == key:
            return self.llama
        self.stop_llama()
        if self.llama_server is None or self.gguf is None:
            raise RuntimeError("no llama-server binary, or no GGUF file for it")
        port = free_port()
        threads = str(self.settings.threads)
        command = [
            str(self.llama_server),
            "-m",
            str(self.gguf),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--parallel",
            str(concurrency),
            "-c",
            str(ctx_per_slot * concurrency),
            "--cont-batching",
            "-t",
            threads,
            "-tb",
            threads,
        ]
        server = Server(
            report.LLAMA_CPP, command, port, self.run_dir / f"llama-server-c{concurrency}.log"
        )
        server.start()
        if not any(name.startswith("llama-server") for name, _ in self.memory):
            assert server.process is not None
            mem = process_tree_memory(server.process.pid)
            self.memory.append(
                (f"llama-server idle RSS, --parallel {concurrency} (MiB)", f"{mem['rss_mib']:.0f}")
            )
        self.llama, self.llama_key = server, key
        return server

    def stop_llama(self) -> None:
        if self.llama is not None:
            self.llama.stop()
        self.llama, self.llama_key = None, None

    def stop_all(self) -> None:
        self.stop_llama()
        for server in self.radixserve.values():
            server.stop()
        self.radixserve.clear()


# ----------------------------------------------------------------------------- running jobs


def bench_serving_command(
    job: Job, server: Server, settings: Settings, model: Path, out: Path
) -> list[str]:
    backend = "sglang" if job.engine.startswith(report.RADIXSERVE) else "openai"
    command = [
        sys.executable,
        "-m",
        "radixserve.bench_serving",
        "--backend",
        backend,
        "--base-url",
        server.base_url,
        "--tokenizer",
        str(model),
        "--num-prompts",
        str(job.num_prompts),
        "--max-concurrency",
        str(job.concurrency),
        "--seed",
        str(seed_for(settings, job)),
        "--output-file",
        str(out),
        "--disable-tqdm",
        "--tag",
        job.label,
        "--output-details",  # per-request lengths and errors, kept in the run dir
    ]
    if backend == "sglang":
        command.append("--flush-cache")  # no prefix-cache hits from the warm-up request
    else:
        command += ["--extra-request-body", json.dumps({"ignore_eos": True})]
    if job.workload == report.RANDOM:
        shape = job.random_shape()
        command += [
            "--dataset-name",
            "random",
            "--random-input-len",
            str(shape.input_len),
            "--random-output-len",
            str(shape.output_len),
            "--random-range-ratio",
            "1.0",
        ]
    else:
        gsp = settings.gsp
        command += [
            "--dataset-name",
            "generated-shared-prefix",
            "--gsp-num-groups",
            str(gsp["num_groups"]),
            "--gsp-prompts-per-group",
            str(gsp["prompts_per_group"]),
            "--gsp-system-prompt-len",
            str(gsp["system_prompt_len"]),
            "--gsp-question-len",
            str(gsp["question_len"]),
            "--gsp-output-len",
            str(gsp["output_len"]),
        ]
    return command


def hf_command(job: Job, settings: Settings, model: Path, out: Path) -> list[str]:
    dtype = "bfloat16" if job.engine == report.HF_BF16 else "float32"
    shape = job.random_shape()
    return [
        sys.executable,
        str(HF_RUNNER),
        "--model",
        str(model),
        "--dtype",
        dtype,
        "--concurrency",
        str(job.concurrency),
        "--num-prompts",
        str(job.num_prompts),
        "--input-len",
        str(shape.input_len),
        "--output-len",
        str(shape.output_len),
        "--seed",
        str(seed_for(settings, job)),
        "--output-file",
        str(out),
    ]


def run_logged(command: Sequence[str], log_path: Path, timeout: float) -> None:
    with log_path.open("ab") as log:
        log.write(("$ " + shlex.join(command) + "\n").encode())
        log.flush()
        completed = subprocess.run(
            command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, timeout=timeout, check=False
        )
    if completed.returncode != 0:
        raise RuntimeError(
            f"exit code {completed.returncode}; log: {log_path}\n{tail(log_path, 8)}"
        )


def last_json_line(path: Path) -> dict[str, Any]:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if not lines:
        raise RuntimeError(f"{path} holds no result")
    return dict(json.loads(lines[-1]))


def job_slug(job: Job) -> str:
    engine = job.engine.replace(" --", "-").replace(".", "").replace(" ", "-")
    shape = "" if job.shape is None else f"-{job.shape.input_len}x{job.shape.output_len}"
    return f"{job.workload}{shape}-c{job.concurrency}-{engine}"


def run_job(job: Job, pool: ServerPool, settings: Settings, timeout: float) -> report.Result:
    result: report.Result = {
        "workload": job.workload,
        "engine": job.engine,
        "concurrency": job.concurrency,
        "num_prompts": job.num_prompts,
        "expected_output_len": job.expected_output_len,
    }
    if job.shape is not None:
        result["input_len"] = job.shape.input_len  # with expected_output_len: the shape
    out = pool.run_dir / f"{job_slug(job)}.jsonl"
    log = pool.run_dir / f"{job_slug(job)}.log"
    out.unlink(missing_ok=True)
    try:
        if job.engine in (report.HF_BF16, report.HF_FP32):
            # A GGUF through transformers' GGUF loader (a folder holding one has no config).
            hf_model = pool.gguf or pool.model
            run_logged(hf_command(job, settings, hf_model, out), log, timeout)
        else:
            server = _server_for(job, pool, settings)
            command = bench_serving_command(job, server, settings, pool.model, out)
            run_logged(command, log, timeout)
        result["metrics"] = summary_metrics(last_json_line(out), result)
    except (RuntimeError, OSError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
        result["error"] = str(exc).splitlines()[0]
    return result


DETAIL_FIELDS = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors")


def summary_metrics(record: dict[str, Any], result: report.Result) -> dict[str, Any]:
    """bench_serving's record without the per-request lists (those stay in the run dir's JSONL);
    the first request errors, if any, go into `result["request_errors"]`."""
    errors = [e for e in record.get("errors") or [] if e]
    if errors:
        result["request_errors"] = [str(e).splitlines()[0][:300] for e in errors[:3]]
    return {k: v for k, v in record.items() if k not in DETAIL_FIELDS and k != "server_info"}


def _server_for(job: Job, pool: ServerPool, settings: Settings) -> Server:
    if job.engine == report.LLAMA_CPP:
        return pool.llama_cpp_server(job.concurrency, llama_ctx_per_slot(settings, job.workload))
    pool.stop_llama()  # nothing but the engine under test should hold a model in memory
    return pool.radixserve_server(job.engine)


# ----------------------------------------------------------------------------- llama.cpp


@dataclass
class LlamaCpp:
    server: Path | None = None
    bench: Path | None = None
    info: dict[str, str] = field(default_factory=dict)


def parse_build_output(stdout: str) -> dict[str, str]:
    """KEY=VALUE lines printed last by build_llama_cpp.sh."""
    values = {}
    for line in stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.isupper() and key.startswith("LLAMA_"):
            values[key] = value.strip()
    return values


def read_info(path: Path) -> dict[str, str]:
    info = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep:
                info[key.strip()] = value.strip()
            elif line.strip():
                info.setdefault("notes", "")
                info["notes"] += line.strip() + " "
    return info


def ensure_llama_cpp(args: argparse.Namespace, gguf: Path) -> LlamaCpp:
    if args.llama_server and (args.llama_bench or args.skip_llama_bench):
        return LlamaCpp(args.llama_server, args.llama_bench)
    print(
        "llama.cpp: building or reusing the cached build (benchmarks/build_llama_cpp.sh) ...",
        flush=True,
    )
    start = time.perf_counter()
    completed = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--model", str(gguf)],
        stdout=subprocess.PIPE,
        text=True,
        check=False,
        cwd=REPO,
    )
    if completed.returncode != 0:
        raise SystemExit(f"building llama.cpp failed (exit code {completed.returncode})")
    values = parse_build_output(completed.stdout)
    info = read_info(Path(values.get("LLAMA_CPP_INFO", "")))
    print(f"llama.cpp ready in {time.perf_counter() - start:.0f}s: {values.get('LLAMA_SERVER')}")
    return LlamaCpp(
        args.llama_server or Path(values["LLAMA_SERVER"]),
        args.llama_bench or Path(values["LLAMA_BENCH"]),
        info,
    )


def llama_bench_command(binary: Path, gguf: Path, threads: int, quick: bool) -> list[str]:
    command = [
        str(binary),
        "-m",
        str(gguf),
        "-p",
        "512",
        "-n",
        "128",
        "-t",
        str(threads),
        "-o",
        "json",
    ]
    return command + (["-r", "2"] if quick else [])


def run_llama_bench(
    command: Sequence[str], run_dir: Path
) -> tuple[list[dict[str, Any]], str | None]:
    log = run_dir / "llama-bench.log"
    completed = subprocess.run(
        list(command), capture_output=True, text=True, check=False, timeout=1800
    )
    log.write_text(completed.stdout + "\n--- stderr ---\n" + completed.stderr)
    if completed.returncode != 0:
        signal_note = f" (signal {-completed.returncode})" if completed.returncode < 0 else ""
        return [], f"llama-bench failed with {completed.returncode}{signal_note}; log: {log}"
    try:
        entries = json.loads(completed.stdout)
    except json.JSONDecodeError:
        return [], f"llama-bench printed no JSON; log: {log}"
    return list(entries), None


# Offline batch-1 runs of radixserve in llama-bench's shapes: pp512 is a 512-token prefill,
# tg128 128 decode steps from an (almost) empty context.
OFFLINE_SHAPES = (("pp512", 512, 1), ("tg128", 1, 129))


def run_radixserve_offline(
    model: Path, settings: Settings, run_dir: Path
) -> tuple[dict[str, float], str | None]:
    """radixserve's bench_one_batch at batch 1 in llama-bench's shapes, right after llama-bench:
    {"pp512": prefill tok/s, "tg128": decode tok/s (every step, as llama-bench counts)}."""
    figures: dict[str, float] = {}
    for test, input_len, output_len in OFFLINE_SHAPES:
        out = run_dir / f"radixserve-offline-{test}.jsonl"
        out.unlink(missing_ok=True)
        command = [
            sys.executable, "-m", "radixserve.bench_one_batch", "--model-path", str(model),
            *settings.radixserve_args, "--batch-size", "1", "--input-len", str(input_len),
            "--output-len", str(output_len), "--result-filename", str(out),
        ]  # fmt: skip
        log = run_dir / f"radixserve-offline-{test}.log"
        with log.open("w") as sink:
            code = subprocess.run(
                command, stdout=sink, stderr=subprocess.STDOUT, check=False
            ).returncode
        if code != 0 or not out.exists():
            return figures, f"radixserve bench_one_batch ({test}) failed with {code}; log: {log}"
        record = json.loads(out.read_text().splitlines()[-1])
        key = "prefill_throughput" if test.startswith("pp") else "mean_decode_throughput"
        figures[test] = float(record[key])
    return figures, None


# ----------------------------------------------------------------------------- machine info


def cpu_info() -> tuple[str, set[str]]:
    model, flags = platform.processor() or platform.machine(), set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in (
                "",
                platform.machine(),
                platform.processor(),
            ):
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    return model, flags


def load_average() -> tuple[float, float, float] | None:
    try:
        return os.getloadavg()
    except OSError:
        return None


def load_text(load: tuple[float, float, float] | None) -> str:
    return "n/a" if load is None else " / ".join(f"{x:.2f}" for x in load)


def busy_machine_warning(load: tuple[float, float, float] | None, cpus: int) -> str | None:
    """A warning when something else kept the CPUs busy as the benchmark began."""
    if load is None or load[0] < 0.5 * cpus:
        return None
    return (
        f"the machine was busy when the benchmark started (1-min load average {load[0]:.2f} on "
        f"{cpus} CPUs): other work competed for the CPUs, so absolute numbers are low and noisy; "
        "the interleaved ratios are the more trustworthy figures"
    )


def memory_total_gib() -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    return None


def package_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def git_revision() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO, check=False)
        return done.stdout.strip()

    revision = git("rev-parse", "--short", "HEAD") or "unknown"
    return revision + (
        " (with uncommitted changes)" if git("status", "--porcelain", "radixserve") else ""
    )


def machine_meta(
    args: argparse.Namespace, settings: Settings, llama: LlamaCpp, model: Path
) -> list[tuple[str, str]]:
    cpu_model, flags = cpu_info()
    present = [f for f in CPU_FLAGS_OF_INTEREST if f in flags]
    absent = [f for f in CPU_FLAGS_OF_INTEREST if f not in flags]
    memory = memory_total_gib()
    info = llama.info
    llama_text = (
        f"llama-cpp-python {info.get('llama_cpp_python_version', '?')} sdist, llama.cpp commit "
        f"{info.get('llama_cpp_commit', '?')[:12]}, build {info.get('variant', '?')}"
        if info
        else str(llama.server or "not used")
    )
    return [
        ("Date", dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")),
        ("Command", "`" + shlex.join(["benchmarks/compare.py", *sys.argv[1:]]) + "`"),
        ("CPU", f"{cpu_model}, {os.cpu_count()} logical CPUs"),
        ("CPU flags", f"has: {', '.join(present) or 'none'}; lacks: {', '.join(absent) or 'none'}"),
        ("Memory", "n/a" if memory is None else f"{memory:.0f} GiB"),
        ("Load average at start (1/5/15 min)", load_text(args.load_at_start)),
        ("OS / Python", f"{platform.platform()} / {platform.python_version()}"),
        ("radixserve", f"{package_version('radixserve')} (git {git_revision()})"),
        ("radixserve args", "`" + (shlex.join(settings.radixserve_args) or "(none)") + "`"),
        ("torch / transformers", f"{package_version('torch')} / {package_version('transformers')}"),
        ("llama.cpp", llama_text),
        ("llama.cpp build flags", info.get("cmake_flags", "n/a") if info else "n/a"),
        ("llama-server threads", str(settings.threads)),
        ("Model", model_text(model)),
    ]


def model_text(model: Path) -> str:
    """The model's name and size on disk (a folder's: all its files)."""
    if not model.exists():  # not a local path (a hub id): the report must still be written
        return str(model)
    if model.is_dir():
        size = sum(f.stat().st_size for f in model.rglob("*") if f.is_file())
        return f"{model.name}/ (folder, {size / 2**20:.0f} MiB)"
    return f"{model.name} ({model.stat().st_size / 2**20:.0f} MiB)"


# ----------------------------------------------------------------------------- document


def describe_settings(
    settings: Settings, llama_bench_cmd: Sequence[str] | None, notes: Sequence[str] = ()
) -> dict[str, Any]:
    prompts = sorted({num_prompts_for(settings, c) for c in settings.concurrencies})
    gsp = settings.gsp
    return {
        "shapes": [list(shape) for shape in settings.shapes],
        "notes": list(notes),
        "hf_batches": settings.hf_batches,
        "num_prompts_text": (
            f"{settings.num_prompts} prompts per run"
            if settings.num_prompts is not None
            else "max(2 x concurrency, 8) prompts per run (" + ", ".join(map(str, prompts)) + ")"
        ),
        "shared_prefix_text": (
            f"`generated-shared-prefix`: {gsp['num_groups']} groups x {gsp['prompts_per_group']} "
            f"prompts, {gsp['system_prompt_len']}-token system prompt shared within a group, "
            f"{gsp['question_len']}-token questions, {gsp['output_len']} output tokens, "
            f"concurrency {gsp['concurrency']}. llama-server keeps each slot's last prompt "
            "(its own prompt cache); radixserve's radix cache is shared by all requests."
        ),
        "llama_bench_command": shlex.join(
            [
                "llama-bench",
                *[Path(a).name if a.endswith(".gguf") else a for a in (llama_bench_cmd or [])[1:]],
            ]
        ),
    }


def write_document(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# ----------------------------------------------------------------------------- main


def ensure_requirements() -> None:
    """Install benchmarks/requirements-compare.txt into this environment when something lacks."""
    import importlib.util

    modules = ("matplotlib", "transformers", "accelerate", "gguf", "psutil", "tqdm")
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return
    print(f"installing the benchmark-only packages ({', '.join(missing)} missing) ...", flush=True)
    command = [sys.executable, "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)]
    subprocess.run(command, check=True)


def default_gguf() -> Path:
    from radixserve.default_model import ensure_default_model

    return Path(ensure_default_model())


def gguf_file_of(model: Path) -> Path | None:
    """The GGUF file llama.cpp would read for `model` (the file, or a folder's only .gguf), or
    None: llama.cpp reads GGUF files only, radixserve and transformers read folders too."""
    from radixserve.models.gguf import find_gguf_file

    try:
        return find_gguf_file(model)
    except ValueError as exc:  # a folder of several GGUFs: radixserve refuses it as well
        raise SystemExit(str(exc)) from None


def skip_llama_cpp(model: Path, settings: Settings) -> tuple[Settings, str]:
    """Settings without the llama.cpp engine, for a model llama.cpp cannot read, and the report's
    note saying so; refuses when no engine is left."""
    engines = [e for e in settings.engines if e != report.LLAMA_CPP]
    if not engines:
        raise SystemExit(
            f"{model} is not a GGUF model, and llama.cpp (the only engine asked for) reads "
            "GGUF files only"
        )
    note = (
        f"llama.cpp skipped: {model.name} is not a GGUF model and llama.cpp reads GGUF files "
        "only, so neither llama-server nor llama-bench ran; the other engines ran on it."
    )
    return dataclasses.replace(settings, engines=engines), note


@contextlib.contextmanager
def server_pool(
    model: Path, gguf: Path | None, llama: LlamaCpp, settings: Settings, run_dir: Path
) -> Iterator[ServerPool]:
    pool = ServerPool(model, gguf, llama.server, settings, run_dir)
    try:
        yield pool
    finally:
        pool.stop_all()


def run_all(
    jobs: Sequence[Job], pool: ServerPool, settings: Settings, timeout: float
) -> list[report.Result]:
    from tqdm import tqdm

    results: list[report.Result] = []
    bar = tqdm(jobs, desc="benchmark", unit="run")
    for job in bar:
        bar.set_postfix_str(job.label)
        result = run_job(job, pool, settings, timeout)
        results.append(result)
        summary = result.get("error") or (
            f"{report.fmt(report.metric(result, 'output_throughput'))} tok/s, "
            f"TTFT {report.fmt(report.metric(result, 'mean_ttft_ms'))} ms"
        )
        bar.write(f"{job.label}: {summary}")
        if job.engine == report.LLAMA_CPP:
            pool.stop_llama()
    return results


def measure(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    """Build if needed, run llama-bench and every job; the record the document is made from."""
    load_at_start = load_average()  # before anything of ours loads the CPUs
    model = Path(args.model_path) if args.model_path else default_gguf()
    gguf = gguf_file_of(model)
    notes: list[str] = []
    if gguf is None:
        settings, note = skip_llama_cpp(model, settings)
        notes.append(note)
        print(note, flush=True)
    run_dir = args.run_dir or DEFAULT_CACHE / "runs" / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"model {model}\nraw results and logs: {run_dir}", flush=True)

    needs_llama = report.LLAMA_CPP in settings.engines or not args.skip_llama_bench
    llama = ensure_llama_cpp(args, gguf) if needs_llama and gguf is not None else LlamaCpp()
    warnings: list[str] = []
    busy = busy_machine_warning(load_at_start, os.cpu_count() or 1)
    warnings += [busy] if busy else []
    bench_entries: list[dict[str, Any]] = []
    bench_cmd: list[str] | None = None
    if llama.bench is not None and gguf is not None and not args.skip_llama_bench:
        bench_cmd = llama_bench_command(llama.bench, gguf, settings.threads, settings.quick)
        print("llama-bench pp512 / tg128 ...", flush=True)
        bench_entries, problem = run_llama_bench(bench_cmd, run_dir)
        warnings += [problem] if problem else []
    offline: dict[str, float] = {}
    # The offline figures only mean something next to llama-bench's, so they go where it goes.
    if report.RADIXSERVE in settings.engines and bench_cmd is not None:
        print("radixserve offline batch 1 in llama-bench's shapes ...", flush=True)
        offline, problem = run_radixserve_offline(model, settings, run_dir)
        warnings += [problem] if problem else []

    with server_pool(model, gguf, llama, settings, run_dir) as pool:
        results = run_all(plan_jobs(settings), pool, settings, args.timeout)
        memory = list(pool.memory)
    if llama.info.get("notes"):
        warnings.append(llama.info["notes"].strip())
    for result in results:
        warnings += report.check_result(result)
    args.load_at_start = load_at_start
    record = {
        "meta": machine_meta(args, settings, llama, model),
        "settings": describe_settings(settings, bench_cmd, notes),
        "results": results,
        "llama_bench": bench_entries,
        "radixserve_offline": offline,
        "memory": memory,
        "warnings": warnings,
    }
    (run_dir / "record.json").write_text(json.dumps(record, indent=2))
    return record


def write_report(record: dict[str, Any], output: Path, plot_path: Path) -> None:
    """docs/performance.md and its plot from a record (keeps the old file's Notes section)."""
    results = record["results"]
    plot = report.plot_throughput(results, plot_path, record["settings"].get("input_len"))
    plot_name = os.path.relpath(plot, output.parent) if plot else None
    existing = output.read_text() if output.exists() else None
    text = report.render_document(
        [tuple(item) for item in record["meta"]],
        results,
        record["settings"],
        record["llama_bench"],
        [tuple(item) for item in record["memory"]],
        record["warnings"],
        plot_name,
        existing,
        offline=record.get("radixserve_offline") or {},
    )
    write_document(output, text)
    print(f"wrote {output}" + (f" and {plot}" if plot else ""))
    for warning in record["warnings"]:
        print(f"warning: {warning}")


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through server_pool, which stops the servers


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    ensure_requirements()
    if args.render_only is not None:
        record = json.loads(args.render_only.read_text())
    else:
        record = measure(args, resolve_settings(args))
    write_report(record, args.output, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
