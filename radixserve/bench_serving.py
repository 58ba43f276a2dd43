"""Benchmark a running server with SGLang's bench_serving command line.

    python -m radixserve.bench_serving --backend sglang --port 30000 \\
        --dataset-name random --num-prompts 100 --random-input-len 256 --random-output-len 64

An asyncio/httpx load generator: requests are sent all at once (--request-rate inf, the
default) or as a Poisson process, optionally capped by --max-concurrency; each is timed from the
stream (TTFT, ITL, TPOT, end-to-end latency). Results are printed as SGLang prints them and one
JSON line with SGLang's field names (plus cache_hit_rate) is appended to --output-file.
Library use: `run_benchmark(args)` with the namespace `build_parser().parse_args(...)` makes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import numpy as np
from tqdm import tqdm

from radixserve.benchmarking.backends import (
    BACKENDS,
    ROUTES,
    RequestSpec,
    auth_headers,
    send_request,
)
from radixserve.benchmarking.datasets import DatasetError, DatasetRow, add_dataset_args, get_dataset
from radixserve.benchmarking.hardware import CPU_FEATURES, read_cpu_flags
from radixserve.benchmarking.metrics import RequestOutput, calculate_metrics
from radixserve.benchmarking.report import append_jsonl, format_table, percent
from radixserve.benchmarking.roofline import estimate_serving_shares

logger = logging.getLogger(__name__)

_DEFAULT_PORTS = {"vllm": 8000, "vllm-chat": 8000, "lmdeploy": 23333, "lmdeploy-chat": 23333}
_LOCAL_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0", "::1", "[::1]")
_TIMEOUT_S = 6 * 3600.0
_UNSUPPORTED = {
    "profile": "--profile needs the server's /start_profile, which radixserve does not serve",
}


class BenchmarkError(RuntimeError):
    """The benchmark cannot run as asked (bad flags, unreachable server, all warmups failed)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m radixserve.bench_serving",
        description="Benchmark the online serving throughput (SGLang's bench_serving flags).",
    )
    parser.add_argument("--backend", default="sglang", choices=sorted(BACKENDS))
    parser.add_argument("--base-url", default=None, help="Server URL, instead of host and port.")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=None, help="Default: the backend's usual port.")
    parser.add_argument("--model", default=None, help="Default: the first of /v1/models.")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--tokenizer", default=None, help="Default: the server's tokenizer.")
    add_dataset_args(parser)
    parser.add_argument("--request-rate", type=float, default=float("inf"))
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--output-file", default=None, help="JSONL file to append results to.")
    parser.add_argument("--output-details", action="store_true")
    parser.add_argument("--disable-tqdm", action="store_true")
    parser.add_argument("--disable-stream", action="store_true")
    parser.add_argument("--disable-ignore-eos", action="store_true")
    parser.add_argument("--return-logprob", action="store_true")
    parser.add_argument("--extra-request-body", default=None, metavar='{"key": "value"}')
    parser.add_argument("--warmup-requests", type=int, default=1)
    parser.add_argument("--flush-cache", action="store_true")
    parser.add_argument("--profile", action="store_true", help="Not supported by radixserve.")
    parser.add_argument(
        "--lora-name",
        nargs="*",
        default=None,
        help="LoRA adapter names; each request runs under one picked at random (seeded by "
        "--seed): native lora_path, or the OpenAI model field.",
    )
    parser.add_argument("--tag", default=None, help="Copied into the JSONL record.")
    return parser


def _base_url(args: argparse.Namespace) -> str:
    if args.base_url:
        return str(args.base_url).rstrip("/")
    host = "127.0.0.1" if args.host in ("0.0.0.0", "") else args.host
    port = args.port or _DEFAULT_PORTS.get(args.backend, 30000)
    return f"http://{host}:{port}"


def _check_args(args: argparse.Namespace) -> None:
    for dest, message in _UNSUPPORTED.items():
        if getattr(args, dest, None):
            raise BenchmarkError(message)
    if args.tokenize_prompt and BACKENDS[args.backend] == "chat":
        raise BenchmarkError("--tokenize-prompt needs a text-or-ids API, not chat completions")
    if args.request_rate <= 0:
        raise BenchmarkError("--request-rate must be positive (inf: all at once)")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise BenchmarkError("--max-concurrency must be at least 1")


def _get_json(client: httpx.Client, url: str) -> dict[str, Any] | None:
    try:
        r = client.get(url)
    except httpx.HTTPError as exc:
        logger.debug("GET %s failed: %s", url, exc)
        return None
    if r.status_code != 200:
        return None
    try:
        body = r.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _local_path(value: Any) -> str | None:
    return str(value) if value and Path(str(value)).expanduser().exists() else None


def load_tokenizer(args: argparse.Namespace, model_info: dict[str, Any] | None) -> Any:
    """--tokenizer; else the server's tokenizer or model path when it is on this machine; else
    the default model's tokenizer."""
    from radixserve.models.tokenizer import get_tokenizer

    info = model_info or {}
    source = (
        args.tokenizer
        or _local_path(info.get("tokenizer_path"))
        or _local_path(info.get("model_path"))
        or _local_path(args.model)
    )
    if source is None:
        from radixserve.default_model import ensure_default_model

        source = str(ensure_default_model())
        logger.warning("The server's tokenizer is not on this machine; using %s", source)
    return get_tokenizer(source)


def _cache_counters(info: dict[str, Any] | None) -> tuple[float, float] | None:
    if not info or "prompt_tokens_total" not in info:
        return None
    return float(info.get("cached_prompt_tokens_total") or 0), float(info["prompt_tokens_total"])


async def _arrivals(
    specs: Sequence[RequestSpec], rate: float, seed: int
) -> AsyncIterator[RequestSpec]:
    """The requests, spaced by exponential gaps (a Poisson process) unless the rate is inf."""
    rng = np.random.default_rng(seed)
    for i, spec in enumerate(specs):
        yield spec
        if rate != float("inf") and i < len(specs) - 1:
            await asyncio.sleep(float(rng.exponential(1.0 / rate)))


async def _run_requests(
    args: argparse.Namespace,
    specs: list[RequestSpec],
    count_tokens: Callable[[str], int],
) -> tuple[list[RequestOutput], float]:
    semaphore = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(_TIMEOUT_S)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
        bar = tqdm(total=len(specs), disable=args.disable_tqdm)

        async def one(spec: RequestSpec) -> RequestOutput:
            if semaphore is None:
                out = await send_request(client, spec, count_tokens)
            else:
                async with semaphore:
                    out = await send_request(client, spec, count_tokens)
            bar.update(1)
            return out

        start = time.perf_counter()
        tasks = []
        async for spec in _arrivals(specs, args.request_rate, args.seed):
            tasks.append(asyncio.create_task(one(spec)))
        outputs = list(await asyncio.gather(*tasks))
        duration = time.perf_counter() - start
        bar.close()
    return outputs, duration


async def _warmup(
    args: argparse.Namespace, spec: RequestSpec, count_tokens: Callable[[str], int]
) -> None:
    if args.warmup_requests <= 0:
        return
    async with httpx.AsyncClient(timeout=httpx.Timeout(_TIMEOUT_S), trust_env=False) as client:
        outs = await asyncio.gather(
            *(send_request(client, spec, count_tokens) for _ in range(args.warmup_requests))
        )
    if not any(o.success for o in outs):
        raise BenchmarkError(f"Warmup failed; check the benchmark arguments. {outs[0].error}")


def _print_results(result: dict[str, Any]) -> None:
    rows: list[Any] = [
        ("Backend:", result["backend"]),
        ("Traffic request rate:", result["request_rate"]),
        ("Max request concurrency:", result["max_concurrency"] or "not set"),
        ("Successful requests:", result["completed"]),
        ("Benchmark duration (s):", result["duration"]),
        ("Total input tokens:", result["total_input_tokens"]),
        ("Total generated tokens:", result["total_output_tokens"]),
        ("Request throughput (req/s):", result["request_throughput"]),
        ("Input token throughput (tok/s):", result["input_throughput"]),
        ("Output token throughput (tok/s):", result["output_throughput"]),
        ("Total token throughput (tok/s):", result["total_throughput"]),
        ("Concurrency:", result["concurrency"]),
        ("Cache hit rate:", percent(result["cache_hit_rate"])),
        "End-to-End Latency",
        ("Mean E2E Latency (ms):", result["mean_e2e_latency_ms"]),
        ("Median E2E Latency (ms):", result["median_e2e_latency_ms"]),
        "Time to First Token",
        ("Mean TTFT (ms):", result["mean_ttft_ms"]),
        ("Median TTFT (ms):", result["median_ttft_ms"]),
        ("P99 TTFT (ms):", result["p99_ttft_ms"]),
        "Time per Output Token (excl. 1st token)",
        ("Mean TPOT (ms):", result["mean_tpot_ms"]),
        ("Median TPOT (ms):", result["median_tpot_ms"]),
        ("P99 TPOT (ms):", result["p99_tpot_ms"]),
        "Inter-Token Latency",
        ("Mean ITL (ms):", result["mean_itl_ms"]),
        ("Median ITL (ms):", result["median_itl_ms"]),
        ("P95 ITL (ms):", result["p95_itl_ms"]),
        ("P99 ITL (ms):", result["p99_itl_ms"]),
        ("Max ITL (ms):", result["max_itl_ms"]),
    ]
    if result.get("compute_share") is not None:
        rows += [
            "Share of this machine's ceilings (estimate)",
            ("Compute (2 x params per token):", percent(result["compute_share"])),
            ("Memory bandwidth (decode):", percent(result["bandwidth_share"])),
        ]
    print(format_table("Serving Benchmark Result", rows))


def _output_file(args: argparse.Namespace) -> str:
    if args.output_file:
        return str(args.output_file)
    day = datetime.now().strftime("%m%d")
    if args.dataset_name.startswith("random"):
        return f"{args.backend}_{day}_{args.num_prompts}_{args.random_input_len}_{args.random_output_len}.jsonl"
    return f"{args.backend}_{day}_{args.num_prompts}_{args.dataset_name}.jsonl"


def run_benchmark(args: argparse.Namespace, tokenizer: Any = None) -> dict[str, Any]:
    """Run the benchmark `args` describes; returns the result record (also appended as JSONL).
    `tokenizer` overrides the one --tokenizer or the server would give."""
    _check_args(args)
    base = _base_url(args)
    kind = BACKENDS[args.backend]
    extra = json.loads(args.extra_request_body) if args.extra_request_body else {}
    if args.return_logprob and kind == "native":
        extra = {"return_logprob": True, "logprob_start_len": -1, **extra}
    with httpx.Client(timeout=30.0, trust_env=False, headers=auth_headers()) as client:
        model_info = _get_json(client, f"{base}/get_model_info")
        model = args.model
        if model is None:
            listing = _get_json(client, f"{base}/v1/models")
            if listing is None:
                raise BenchmarkError(
                    f"Cannot reach {base}/v1/models; pass --host/--port or --base-url"
                )
            model = (listing.get("data") or [{}])[0].get("id")
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(args, model_info)
        rows = get_dataset(args, tokenizer)
        if not rows:
            raise BenchmarkError("The dataset produced no prompts")
        model_id = args.served_model_name or model
        lora_rng = random.Random(args.seed)

        def spec(row: DatasetRow, output_len: int | None = None) -> RequestSpec:
            return RequestSpec(
                api_url=f"{base}{ROUTES[kind]}",
                kind=kind,
                model=model_id,
                prompt=row.prompt,
                prompt_len=row.prompt_len,
                output_len=output_len or row.output_len,
                stream=not args.disable_stream,
                ignore_eos=not args.disable_ignore_eos,
                extra_body=extra,
                lora_name=lora_rng.choice(args.lora_name) if args.lora_name else None,
            )

        def count_tokens(text: str) -> int:
            return len(tokenizer.encode(text, add_special_tokens=False))

        print(f"Starting warmup with {args.warmup_requests} sequences...")
        asyncio.run(_warmup(args, spec(rows[0], min(rows[0].output_len, 32)), count_tokens))
        if args.flush_cache:
            flushed = client.post(f"{base}/flush_cache")
            if flushed.status_code != 200:
                logger.warning("/flush_cache answered %d: %s", flushed.status_code, flushed.text)
        info_before = _get_json(client, f"{base}/get_server_info")
        specs = [spec(row) for row in rows]
        outputs, duration = asyncio.run(_run_requests(args, specs, count_tokens))
        server_info = _get_json(client, f"{base}/get_server_info")
    result: dict[str, Any] = {
        "tag": args.tag,
        "backend": args.backend,
        "dataset_name": args.dataset_name,
        "request_rate": args.request_rate,
        "max_concurrency": args.max_concurrency,
        "sharegpt_output_len": args.sharegpt_output_len,
        "random_input_len": args.random_input_len,
        "random_output_len": args.random_output_len,
        "random_range_ratio": args.random_range_ratio,
        "server_info": server_info,
    }
    result.update(calculate_metrics(outputs, duration))
    before, after = _cache_counters(info_before), _cache_counters(server_info)
    if result["cache_hit_rate"] is None and before and after and after[1] > before[1]:
        result["cache_hit_rate"] = (after[0] - before[0]) / (after[1] - before[1])
    if result["completed"] == 0:
        logger.warning("All requests failed; the first error: %s", outputs[0].error)
    model_path = _local_path((model_info or {}).get("model_path"))
    estimate = None
    if _is_local(base) and model_path and server_info:
        estimate = estimate_serving_shares(result, model_path, server_info)
    if estimate is None:
        flags = read_cpu_flags()
        print("CPU features: " + ", ".join(f if f in flags else f"no {f}" for f in CPU_FEATURES))
    else:
        hardware, shares = estimate
        print("\n".join(hardware.describe()))
        result.update(shares)
    _print_results(result)
    if args.output_details:
        result["input_lens"] = [o.prompt_len for o in outputs]
        result["output_lens"] = [o.output_len for o in outputs]
        result["ttfts"] = [o.ttft for o in outputs]
        result["itls"] = [o.itl for o in outputs]
        result["generated_texts"] = [o.generated_text for o in outputs]
        result["errors"] = [o.error for o in outputs]
    append_jsonl(_output_file(args), result)
    return result


def _is_local(base_url: str) -> bool:
    return (urlparse(base_url).hostname or "") in {h.strip("[]") for h in _LOCAL_HOSTS}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    print(f"benchmark_args={args}")
    try:
        run_benchmark(args)
    except (BenchmarkError, DatasetError) as exc:
        print(f"bench_serving: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
