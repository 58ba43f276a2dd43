"""Latency of one static batch, without a server (SGLang's bench_one_batch command line).

    python -m radixserve.bench_one_batch --batch-size 1 8 --input-len 256 --output-len 32

Loads the model with a ModelRunner and drives ModelRunner.forward directly with StepInputs, over
its own KV allocator and request-to-token table (as the scheduler does): one prefill step of
`batch_size` prompts of `input_len` random tokens, then `output_len - 1` decode steps of the
whole batch (greedy). Every option of `radixserve serve` is accepted too. Each run is appended
to --result-filename as one JSON line with SGLang's fields.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from radixserve.benchmarking.hardware import CeilingShares, HardwareInfo, ceiling_shares
from radixserve.benchmarking.model_cost import ZERO_COST, ModelCost, StepCost
from radixserve.benchmarking.report import append_jsonl
from radixserve.benchmarking.server_cli import configure_logging, new_parser, parse_with_server_args

if TYPE_CHECKING:
    from radixserve.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)

CORRECTNESS_PROMPTS = (
    "The capital of France is",
    "The capital of the United Kindom is",
    "Today is a sunny day and I like",
)


@dataclass(frozen=True)
class BenchArgs:
    run_name: str
    batch_size: tuple[int, ...]
    input_len: tuple[int, ...]
    output_len: tuple[int, ...]
    result_filename: str
    correctness_test: bool
    cut_len: int
    log_decode_step: int

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> BenchArgs:
        return cls(
            ns.run_name,
            tuple(ns.batch_size),
            tuple(ns.input_len),
            tuple(ns.output_len),
            ns.result_filename,
            ns.correctness_test,
            ns.cut_len,
            ns.log_decode_step,
        )


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(
        "python -m radixserve.bench_one_batch",
        "Benchmark the latency of running a single static batch without a server.",
    )
    parser.add_argument("--run-name", default="default")
    parser.add_argument("--batch-size", type=int, nargs="+", default=[1])
    parser.add_argument("--input-len", type=int, nargs="+", default=[1024])
    parser.add_argument("--output-len", type=int, nargs="+", default=[16])
    parser.add_argument("--result-filename", default="result.jsonl")
    parser.add_argument("--correctness-test", action="store_true")
    parser.add_argument("--cut-len", type=int, default=4)
    parser.add_argument("--log-decode-step", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="Not supported by radixserve.")
    return parser


class StaticBatch:
    """A fixed set of requests advanced together, over a private allocator and request table
    sized from the runner's memory plan (what the scheduler builds, minus the prefix cache)."""

    def __init__(self, runner: ModelRunner, max_reqs: int, cost: ModelCost) -> None:
        from radixserve.mem_cache.allocator import TokenToKVPoolAllocator
        from radixserve.mem_cache.req_to_token_pool import ReqToTokenPool

        args = runner.server_args
        self.runner = runner
        self.cost = cost
        self.allocator = TokenToKVPoolAllocator(
            runner.plan.max_total_tokens, args.page_size, runner.device
        )
        self.pool = ReqToTokenPool(max_reqs, runner.model_config.context_len, runner.device)
        self.rows: list[int] = []
        self.lens: list[int] = []
        self.last_cost = ZERO_COST

    def clear(self) -> None:
        self.allocator.clear()
        self.pool.clear()
        self.rows, self.lens = [], []

    def extend(self, new_tokens: Sequence[Sequence[int]], is_decode: bool = False) -> torch.Tensor:
        """Append new_tokens[i] to request i (new requests get a table row); returns the logits
        of each request's last new token."""
        from radixserve.model_executor.step_builder import StepBuilder

        while len(self.rows) < len(new_tokens):
            row = self.pool.alloc()
            if row is None:
                raise MemoryError("no free request rows")
            self.rows.append(row)
            self.lens.append(0)
        builder = StepBuilder()
        for i, tokens in enumerate(new_tokens):
            row, start, n = self.rows[i], self.lens[i], len(tokens)
            last = int(self.pool.req_to_token[row, start - 1]) if start else -1
            got = self.allocator.alloc(n, last)
            if got is None:
                raise MemoryError("the KV pool is full: raise --max-total-tokens")
            self.pool.write(row, start, got)
            builder.add(row, start, [int(t) for t in tokens], slots=got)
        step = builder.build(is_decode=is_decode)
        logits = self.runner.forward(step, self.pool.req_to_token).full_logits()
        self.last_cost = self.cost.step(step.prefix_lens, step.extend_lens, len(step.logits_rows))
        for i, tokens in enumerate(new_tokens):
            self.lens[i] += len(tokens)
        return logits

    def greedy(self, new_tokens: Sequence[Sequence[int]], is_decode: bool = False) -> list[int]:
        """One step, then the argmax token of each request (its .tolist() waits for the device)."""
        return self.extend(new_tokens, is_decode).argmax(dim=-1).tolist()


def _shares(cost: StepCost, seconds: float, hw: HardwareInfo, dtype: str) -> CeilingShares:
    tokens = max(cost.tokens, 1)
    return ceiling_shares(tokens / seconds, cost.bytes / tokens, cost.flops / tokens, hw, dtype)


def run_once(
    batch: StaticBatch,
    bench: BenchArgs,
    input_ids: np.ndarray,
    output_len: int,
    hw: HardwareInfo | None,
    verbose: bool = True,
) -> dict[str, Any] | None:
    """Prefill then decode one static batch; SGLang's measurement record (None: skipped)."""
    bs, input_len = input_ids.shape
    runner = batch.runner
    say = print if verbose else (lambda *_: None)
    if bs * (input_len + output_len) > runner.plan.max_total_tokens:
        say(f"skipping ({bs}, {input_len}, {output_len}) due to max batch size limit")
        return None
    if input_len + output_len > runner.model_config.context_len:
        say(f"skipping ({bs}, {input_len}, {output_len}): longer than the context length")
        return None
    batch.clear()
    record: dict[str, Any] = {
        "run_name": bench.run_name,
        "batch_size": bs,
        "input_len": input_len,
        "output_len": output_len,
    }
    dtype = str(runner.dtype).removeprefix("torch.")
    _sync(runner.device)
    tic = time.perf_counter()
    next_ids = batch.greedy(input_ids.tolist())
    prefill = time.perf_counter() - tic
    prefill_cost = batch.last_cost
    total = prefill
    say(f"Prefill. latency: {prefill:6.5f} s, throughput: {bs * input_len / prefill:9.2f} token/s")
    record["prefill_latency"] = prefill
    record["prefill_throughput"] = bs * input_len / prefill
    if hw is not None:
        shares = _shares(prefill_cost, prefill, hw, dtype)
        say("  " + shares.describe("prefill"))
        record["prefill_compute_share"] = shares.compute_share
        record["prefill_bandwidth_share"] = shares.bandwidth_share
    latencies: list[float] = []
    decode_cost = ZERO_COST
    for i in range(output_len - 1):
        tic = time.perf_counter()
        next_ids = batch.greedy([[t] for t in next_ids], is_decode=True)
        latency = time.perf_counter() - tic
        latencies.append(latency)
        decode_cost = decode_cost + batch.last_cost
        total += latency
        if i < 5 or (bench.log_decode_step > 0 and i % bench.log_decode_step == 0):
            say(
                f"Decode {i}. Batch size: {bs}, latency: {latency:6.5f} s, "
                f"throughput: {bs / latency:9.2f} token/s"
            )
    if latencies:
        median = statistics.median(latencies)
        say(
            f"Decode.  median latency: {median:6.5f} s, median throughput: {bs / median:9.2f} token/s"
        )
        record["median_decode_latency"] = median
        # The fastest step: on a shared machine the least disturbed by other processes.
        record["min_decode_latency"] = min(latencies)
        record["median_decode_throughput"] = bs / median
        # Every step counted, as llama-bench's tg figures are (tokens / total time).
        record["mean_decode_throughput"] = bs * len(latencies) / sum(latencies)
        if hw is not None:
            mean_step = StepCost(
                bs, decode_cost.flops / len(latencies), decode_cost.bytes / len(latencies)
            )
            shares = _shares(mean_step, median, hw, dtype)
            say("  " + shares.describe("decode (median step)"))
            record["decode_compute_share"] = shares.compute_share
            record["decode_bandwidth_share"] = shares.bandwidth_share
    throughput = (input_len + output_len) * bs / total
    say(f"Total. latency: {total:6.3f} s, throughput: {throughput:9.2f} token/s")
    record["total_latency"] = total
    record["overall_throughput"] = throughput
    batch.clear()
    return record


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def correctness_test(batch: StaticBatch, tokenizer: Any, bench: BenchArgs) -> None:
    """SGLang's check: prefill the first cut_len tokens, extend with the rest over that cached
    prefix, decode greedily, print the texts."""
    prompts = [tokenizer.encode(p) for p in CORRECTNESS_PROMPTS]
    if any(len(ids) <= bench.cut_len for ids in prompts):
        raise ValueError(f"--cut-len {bench.cut_len} leaves a prompt with nothing to extend")
    print(f"\ninput_ids={prompts}\n")
    batch.clear()
    cut = bench.cut_len
    if cut > 0:
        logits = batch.extend([ids[:cut] for ids in prompts])
        print(f"prefill logits (first half): {logits} \n")
    logits = batch.extend([ids[cut:] if cut > 0 else ids for ids in prompts])
    print(f"prefill logits (final): {logits} \n")
    outputs = [list(ids) + [t] for ids, t in zip(prompts, logits.argmax(-1).tolist(), strict=True)]
    for _ in range(bench.output_len[0] - 1):
        next_ids = batch.greedy([[out[-1]] for out in outputs], is_decode=True)
        for out, token in zip(outputs, next_ids, strict=True):
            out.append(token)
    for i, out in enumerate(outputs):
        print(f"========== Prompt {i} ==========")
        print(tokenizer.decode(out), "\n")
    batch.clear()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns, server_args = parse_with_server_args(parser, argv)
    if ns.profile:
        parser.error("--profile is not supported by radixserve's bench_one_batch")
    bench = BenchArgs.from_namespace(ns)
    if min(bench.batch_size + bench.input_len + bench.output_len) < 1:
        parser.error("--batch-size, --input-len and --output-len must be at least 1")
    configure_logging(server_args.log_level)
    from radixserve.benchmarking.hardware import detect_hardware
    from radixserve.managers.process_utils import freeze_startup_objects
    from radixserve.model_executor.model_runner import ModelRunner

    runner = ModelRunner(server_args)
    print(f"max_total_num_tokens={runner.plan.max_total_tokens}")
    cost = ModelCost.from_model(runner.model, runner.model_config, runner.kv_cache.dtype)
    max_bs = max(bench.batch_size + (len(CORRECTNESS_PROMPTS),))
    batch = StaticBatch(runner, max_bs, cost)
    freeze_startup_objects()  # as the scheduler process does
    if bench.correctness_test:
        from radixserve.managers.scheduler_factory import load_tokenizer

        correctness_test(batch, load_tokenizer(server_args, str(runner.model_dir)), bench)
        return 0
    hw = detect_hardware(runner.device)
    print("\n".join(hw.describe()))
    print(
        f"Model: {cost.params / 1e6:.1f}M parameters, {cost.weight_bytes / 2**20:.1f} MiB of "
        f"weights ({cost.dtype}), KV {cost.kv_bytes_per_token} bytes per token"
    )
    if cost.expert_layers:  # what one token reads: its top-k experts of each MoE layer
        print(
            f"Active per token: {cost.active_params / 1e6:.1f}M parameters, "
            f"{cost.active_bytes / 2**20:.1f} MiB"
        )
    rng = np.random.default_rng(server_args.random_seed)
    high = min(runner.model_config.vocab_size, 10000)
    print("Warmup ...")
    warm = rng.integers(0, high, (bench.batch_size[0], bench.input_len[0]))
    run_once(batch, bench, warm, min(32, bench.output_len[0]), None, verbose=False)
    print("Benchmark ...")
    for bs, il, ol in itertools.product(bench.batch_size, bench.input_len, bench.output_len):
        record = run_once(batch, bench, rng.integers(0, high, (bs, il)), ol, hw)
        if record is not None and bench.result_filename:
            append_jsonl(bench.result_filename, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
