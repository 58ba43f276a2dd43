"""Offline decode/prefill throughput of the Engine, with the hardware ceiling beside it.

    .venv/bin/python benchmarks/bench_offline.py --batch-sizes 1 8 32 --max-new-tokens 64

For each batch size it reports output tokens/s and decode steps/s, and compares the bytes the
model must stream per decode step (all weights once per step) against the machine's measured
memory bandwidth (a large tensor copy, measured in the same run), so the share of the
bandwidth ceiling reached is printed next to each number.
"""

from __future__ import annotations

import argparse
import logging
import time

import torch
from tqdm import tqdm

from radixserve import Engine


def measure_bandwidth_gbs(num_bytes: int = 1 << 28, repeats: int = 5) -> float:
    """Read+write bandwidth of a tensor copy (GB/s): the memory ceiling for decode."""
    src = torch.empty(num_bytes // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * num_bytes / best / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    kwargs = {"dtype": args.dtype, "max_total_tokens": 32768, "runtime": "thread"}
    if args.model_path:
        kwargs["model_path"] = args.model_path
    with Engine(**kwargs) as engine:
        weights = sum(
            p.numel() * p.element_size() for p in engine.runtime.runner.model.parameters()
        )
        bandwidth = measure_bandwidth_gbs()
        print(f"weights {weights / 1e6:.0f} MB, measured bandwidth {bandwidth:.1f} GB/s")
        engine.generate("warm up", {"max_new_tokens": 4})
        for bs in tqdm(args.batch_sizes, desc="batch sizes"):
            prompts = [f"Write a short story about the number {i}." for i in range(bs)]
            params = {"max_new_tokens": args.max_new_tokens, "ignore_eos": True, "temperature": 0}
            engine.flush_cache()
            start = time.perf_counter()
            results = engine.generate(prompts, params)
            elapsed = time.perf_counter() - start
            tokens = sum(r["meta_info"]["completion_tokens"] for r in results)
            steps_per_s = args.max_new_tokens / elapsed
            ceiling_steps = bandwidth * 1e9 / weights
            tqdm.write(
                f"bs={bs:3d}: {tokens / elapsed:8.1f} tok/s, {steps_per_s:6.1f} steps/s "
                f"({100 * steps_per_s / ceiling_steps:5.1f}% of the {ceiling_steps:.0f} steps/s "
                f"that streaming the weights at {bandwidth:.0f} GB/s allows)"
            )


if __name__ == "__main__":
    main()
