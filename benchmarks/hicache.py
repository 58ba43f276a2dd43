"""Mean time to first token with the hierarchical cache against without it, side by side.

    .venv/bin/python benchmarks/hicache.py --docs 6 --doc-tokens 800 --rounds 3

Many long prompts share per-document prefixes ("document i, question j"); together they are
far larger than the device KV pool, so by the time a document comes back the device cache has
evicted it. Two engines with the same device pool run in one process: "device" (radix cache
only) recomputes the document, "tiers" (--enable-hierarchical-cache) loads it back from the
host tier. With --storage DIR a third engine, "disk", has a host tier too small to keep any
document past the one it loads now (a host tier must hold a whole load), so its hits come
from --hicache-storage-backend file. Requests
run one at a time, interleaved across engines (the same request on each, in rotating order),
so drifting machine load touches every configuration alike. TTFT is the latency of a
generate call with max_new_tokens=1.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import time
from typing import Any

from radixserve import Engine
from radixserve.mem_cache.hicache.config import FILE_STORAGE_DIR_ENV


def workload(engine: Engine, docs: int, doc_tokens: int, rounds: int) -> list[list[int]]:
    """rounds x docs prompts: each round asks every document one new question."""
    rng = random.Random(0)
    words = ["river", "stone", "light", "garden", "engine", "winter", "market", "signal"]
    tok = engine.tokenizer
    bodies = []
    for d in range(docs):
        text = " ".join(rng.choice(words) for _ in range(doc_tokens * 2))
        bodies.append(tok.encode(f"Document {d}: {text}", add_special_tokens=False)[:doc_tokens])
    return [
        bodies[d] + tok.encode(f" Question {r}: what is word {r + d}?", add_special_tokens=False)
        for r in range(rounds)
        for d in range(docs)
    ]


def ttft(engine: Engine, prompt: list[int]) -> tuple[float, dict[str, Any]]:
    params = {"temperature": 0, "max_new_tokens": 1}
    start = time.perf_counter()
    out = engine.generate(input_ids=prompt, sampling_params=params)
    return time.perf_counter() - start, out["meta_info"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default=None, help="default: radixserve's default model")
    parser.add_argument("--docs", type=int, default=6)
    parser.add_argument("--doc-tokens", type=int, default=800)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device-docs", type=int, default=2, help="device pool, in documents")
    parser.add_argument("--storage", default=None, help="folder for a third, disk-tier engine")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    base: dict[str, Any] = {
        "runtime": "thread",
        "max_total_tokens": args.device_docs * (args.doc_tokens + 64),
    }
    if args.model_path:
        base["model_path"] = args.model_path
    configs: dict[str, dict[str, Any]] = {
        "device": {},
        "tiers": {"enable_hierarchical_cache": True, "hicache_ratio": 2.0 * args.docs},
    }
    if args.storage:
        os.environ[FILE_STORAGE_DIR_ENV] = args.storage
        configs["disk"] = {
            "enable_hierarchical_cache": True,
            "hicache_storage_backend": "file",
            # About one document: the rotation brings every other one back from disk.
            "hicache_ratio": 1.0 / args.device_docs,
        }
    engines = {name: Engine(**base, **extra) for name, extra in configs.items()}
    try:
        prompts = workload(next(iter(engines.values())), args.docs, args.doc_tokens, args.rounds)
        times: dict[str, list[float]] = {name: [] for name in engines}
        names = list(engines)
        for i, prompt in enumerate(prompts):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                seconds, _ = ttft(engines[name], prompt)
                if i >= args.docs:  # the first round fills the caches; report the rest
                    times[name].append(seconds)
        report(args, engines, times, sum(map(len, prompts)) / len(prompts))
    finally:
        for engine in engines.values():
            engine.shutdown()


def report(
    args: argparse.Namespace,
    engines: dict[str, Engine],
    times: dict[str, list[float]],
    mean_len: float,
) -> None:
    first = next(iter(engines.values())).get_server_info()
    print(
        f"{args.docs} documents x {args.rounds} rounds, mean prompt {mean_len:.0f} tokens, "
        f"device pool {first['max_total_num_tokens']} tokens; TTFT over rounds 2..{args.rounds}"
    )
    print("| config | mean TTFT (ms) | median (ms) | cached tokens device / host / storage |")
    print("|---|---:|---:|---|")
    for name, engine in engines.items():
        info = engine.get_server_info()
        tiers = " / ".join(
            str(info.get(f"cached_tokens_{t}_total", "-")) for t in ("device", "host", "storage")
        )
        if "cached_tokens_device_total" not in info:
            tiers = f"{info['cached_prompt_tokens_total']} / - / -"
        ms = [1e3 * t for t in times[name]]
        print(f"| {name} | {statistics.mean(ms):.1f} | {statistics.median(ms):.1f} | {tiers} |")


if __name__ == "__main__":
    main()
