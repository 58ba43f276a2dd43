"""Offline throughput of the Engine (SGLang's bench_offline_throughput command line).

    python -m radixserve.bench_offline_throughput --dataset-name random --num-prompts 64 \\
        --random-input-len 256 --random-output-len 64

Builds an `Engine(runtime="thread")` from the `radixserve serve` options given, submits every
prompt at once (greedy, ignore_eos unless --disable-ignore-eos) and reports request, input,
output and total token throughput; the model runner's steps are counted meanwhile, so the
shares of the machine's measured compute and memory-bandwidth ceilings are exact for the work
done. --result-filename appends one JSON line with SGLang's fields.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from radixserve.benchmarking.datasets import (
    DatasetError,
    DatasetRow,
    add_dataset_args,
    get_dataset,
    sample_random_requests,
)
from radixserve.benchmarking.hardware import HardwareInfo, ceiling_shares
from radixserve.benchmarking.model_cost import ForwardCounter, ModelCost
from radixserve.benchmarking.report import append_jsonl, format_table, percent
from radixserve.benchmarking.server_cli import configure_logging, new_parser, parse_with_server_args

if TYPE_CHECKING:
    from radixserve.entrypoints.engine import Engine
    from radixserve.managers.outputs import GenerateOutput

logger = logging.getLogger(__name__)

_WARMUP_PROMPTS = 16
_WARMUP_INPUT_LEN = 256
_WARMUP_OUTPUT_LEN = 16


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(
        "python -m radixserve.bench_offline_throughput",
        "Benchmark the throughput in the offline mode (the Engine, no HTTP).",
    )
    parser.add_argument("--backend", default="engine", choices=["engine"])
    parser.add_argument("--result-filename", default="")
    add_dataset_args(parser, ("sharegpt", "random", "random-ids", "generated-shared-prefix"))
    parser.add_argument("--disable-ignore-eos", action="store_true")
    parser.add_argument("--extra-request-body", default=None, metavar='{"key": "value"}')
    parser.add_argument("--skip-warmup", action="store_true")
    parser.add_argument("--disable-tqdm", action="store_true")
    parser.add_argument("--profile", action="store_true", help="Not supported by radixserve.")
    parser.add_argument("--do-not-exit", action="store_true", help="Not supported.")
    return parser


def _generate(
    engine: Engine, rows: Sequence[DatasetRow], ignore_eos: bool, extra: dict[str, Any]
) -> list[GenerateOutput]:
    from radixserve.entrypoints.engine_inputs import GenerateCall  # with the Engine, lazily

    params = [
        {"temperature": 0, "max_new_tokens": r.output_len, "ignore_eos": ignore_eos, **extra}
        for r in rows
    ]
    if all(isinstance(r.prompt, str) for r in rows):
        call = GenerateCall(prompt=[str(r.prompt) for r in rows], sampling_params=params)
    else:
        ids = [
            r.prompt if isinstance(r.prompt, list) else engine.tokenizer.encode(r.prompt)
            for r in rows
        ]
        call = GenerateCall(input_ids=ids, sampling_params=params)
    out = engine.generate_outputs(call)  # not a stream: one result, or a list of them
    return out if isinstance(out, list) else [out]  # type: ignore[list-item]


def throughput_test_once(
    engine: Engine, rows: Sequence[DatasetRow], ignore_eos: bool, extra: dict[str, Any]
) -> dict[str, Any]:
    """SGLang's measurement record for one batch of requests."""
    start = time.perf_counter()
    outputs = _generate(engine, rows, ignore_eos, extra)
    latency = time.perf_counter() - start
    metas = [o.meta_info for o in outputs]
    total_input = sum(r.prompt_len for r in rows)
    total_output = sum(m.completion_tokens for m in metas)
    prompt_tokens = sum(m.prompt_tokens for m in metas)
    cached = sum(m.cached_tokens for m in metas)
    return {
        "backend": "engine",
        "successful_requests": len(rows),
        "total_latency": latency,
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(rows) / latency,
        "input_throughput": total_input / latency,
        "output_throughput": total_output / latency,
        "total_throughput": (total_input + total_output) / latency,
        "cache_hit_rate": cached / prompt_tokens if prompt_tokens else None,
    }


def _add_shares(
    result: dict[str, Any], counter: ForwardCounter, hw: HardwareInfo, seconds: float
) -> None:
    """Shares of the ceilings reached by all the forward steps the run made."""
    total = counter.total
    tokens = max(total.tokens, 1)
    shares = ceiling_shares(
        tokens / seconds, total.bytes / tokens, total.flops / tokens, hw, counter.cost.dtype
    )
    result["forward_steps"] = counter.steps
    result["decode_steps"] = counter.decode_steps
    result["achieved_gflops"] = shares.achieved_gflops
    result["achieved_gbs"] = shares.achieved_gbs
    result["compute_share"] = shares.compute_share
    result["bandwidth_share"] = shares.bandwidth_share


def _print(result: dict[str, Any]) -> None:
    rows: list[Any] = [
        ("Backend:", result["backend"]),
        ("Successful requests:", result["successful_requests"]),
        ("Benchmark duration (s):", result["total_latency"]),
        ("Total input tokens:", result["total_input_tokens"]),
        ("Total generated tokens:", result["total_output_tokens"]),
        ("Request throughput (req/s):", result["request_throughput"]),
        ("Input token throughput (tok/s):", result["input_throughput"]),
        ("Output token throughput (tok/s):", result["output_throughput"]),
        ("Total token throughput (tok/s):", result["total_throughput"]),
        ("Cache hit rate:", percent(result["cache_hit_rate"])),
    ]
    if "compute_share" in result:
        rows += [
            "Share of the measured ceilings",
            ("Forward steps (decode):", f"{result['forward_steps']} ({result['decode_steps']})"),
            ("Compute (GFLOP/s):", result["achieved_gflops"]),
            ("Compute share:", percent(result["compute_share"])),
            ("Memory traffic (GB/s):", result["achieved_gbs"]),
            ("Memory-bandwidth share:", percent(result["bandwidth_share"])),
        ]
    print(format_table("Offline Throughput Benchmark Result", rows))


def throughput_test(server_args: Any, args: argparse.Namespace) -> dict[str, Any]:
    from radixserve.benchmarking.hardware import detect_hardware
    from radixserve.entrypoints.engine import Engine
    from radixserve.managers.process_utils import freeze_startup_objects

    extra = json.loads(args.extra_request_body) if args.extra_request_body else {}
    ignore_eos = not args.disable_ignore_eos
    with Engine(server_args=server_args, runtime="thread") as engine:
        runner = engine.runtime.runner
        cost = ModelCost.from_model(runner.model, runner.model_config, runner.kv_cache.dtype)
        rows = get_dataset(args, engine.tokenizer)
        if not rows:
            raise DatasetError("the dataset produced no prompts")
        # As the scheduler process does after start-up: the model, tokenizer and prompts leave
        # the collector's generations, so the steps' garbage collections stop walking them.
        freeze_startup_objects()
        hw = detect_hardware(runner.device)
        print("\n".join(hw.describe()))
        if not args.skip_warmup:
            logger.info("Warmup...")
            warm = sample_random_requests(
                engine.tokenizer,
                min(_WARMUP_INPUT_LEN, max(r.prompt_len for r in rows)),
                _WARMUP_OUTPUT_LEN,
                min(len(rows), _WARMUP_PROMPTS),
                1.0,
                np.random.default_rng(args.seed),
            )
            throughput_test_once(engine, warm, ignore_eos, extra)
            engine.flush_cache()
        logger.info("Benchmark...")
        counter = ForwardCounter(runner, cost)
        try:
            result = throughput_test_once(engine, rows, ignore_eos, extra)
        finally:
            counter.close()
        _add_shares(result, counter, hw, result["total_latency"])
    if args.result_filename:
        append_jsonl(args.result_filename, result)
    _print(result)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, server_args = parse_with_server_args(parser, argv)
    for flag in ("profile", "do_not_exit"):
        if getattr(args, flag):
            parser.error(f"--{flag.replace('_', '-')} is not supported by radixserve")
    configure_logging(server_args.log_level)
    try:
        throughput_test(server_args, args)
    except DatasetError as exc:
        print(f"bench_offline_throughput: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
