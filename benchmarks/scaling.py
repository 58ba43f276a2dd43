"""Throughput of the scale-out layouts side by side: dp 1, dp 2 and tp 2 (or any list: pp2,
tp2pp2, ...).

    .venv/bin/python benchmarks/scaling.py                        # a 135M-sized Llama, dummy weights
    .venv/bin/python benchmarks/scaling.py --layouts dp1 dp2 tp3 --model-path default

Each layout is one Engine (the process runtime, as the server runs it) serving the same batch
of requests at once (random token prompts, greedy, ignore_eos); the table gives wall time,
output tokens/s and requests/s per layout, and the ratio to the first layout. The default
model (SmolLM2-135M: 9 attention heads, 3 KV heads) cannot split over 2 ranks, so the default
run uses a Llama of the same size (hidden 576, 30 layers) with 8 heads and random weights:
throughput does not depend on the weights' values.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

from radixserve import Engine

# SmolLM2-135M's shape, with head counts that 2 ranks can split.
SMOL_LIKE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 49152,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


class Result(NamedTuple):
    layout: str
    seconds: float
    output_tokens: int
    requests: int
    startup_s: float


def parse_layout(name: str) -> dict[str, int]:
    """'dp2' -> {'dp_size': 2}; 'dp2tp2' -> both; 'pp2' pipeline stages, 'pp2mb4' with
    micro-batches of at most 4 requests; 'dp1' is the single engine."""
    sizes: dict[str, int] = {}
    rest = name
    while rest:
        kind, rest = rest[:2], rest[2:]
        digits = ""
        while rest and rest[0].isdigit():
            digits, rest = digits + rest[0], rest[1:]
        if kind not in ("dp", "tp", "pp", "mb") or not digits:
            raise ValueError(f"layout {name!r}: expected e.g. dp1, dp2, tp2, pp2, pp2mb4, dp2tp2")
        key = "pp_max_micro_batch_size" if kind == "mb" else f"{kind}_size"
        sizes[key] = int(digits)
    return sizes


def run_layout(
    layout: str, engine_kwargs: dict[str, Any], prompts: list[list[int]], max_new_tokens: int
) -> Result:
    start = time.perf_counter()
    with Engine(**engine_kwargs, **parse_layout(layout)) as engine:
        startup = time.perf_counter() - start
        params = {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0}
        # Warm up with the same batch (first calls of each shape pay one-off costs).
        engine.generate(input_ids=prompts, sampling_params={**params, "max_new_tokens": 4})
        engine.flush_cache()
        begin = time.perf_counter()
        results = engine.generate(input_ids=prompts, sampling_params=params)
        seconds = time.perf_counter() - begin
    tokens = sum(len(r["output_ids"]) for r in results)
    return Result(layout, seconds, tokens, len(results), startup)


def table(results: list[Result]) -> str:
    base = results[0].output_tokens / results[0].seconds
    lines = [
        "| layout | startup s | wall s | output tok/s | req/s | vs " + results[0].layout + " |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        rate = r.output_tokens / r.seconds
        lines.append(
            f"| {r.layout} | {r.startup_s:.1f} | {r.seconds:.2f} | {rate:.1f} | "
            f"{r.requests / r.seconds:.2f} | {rate / base:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", nargs="+", default=["dp1", "dp2", "tp2"])
    parser.add_argument(
        "--model-path", default=None, help="'default' for SmolLM2-135M; else a 135M-sized Llama"
    )
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    with tempfile.TemporaryDirectory(prefix="radixserve-scaling-") as folder:
        kwargs: dict[str, Any] = {
            "dtype": args.dtype,
            "max_total_tokens": 16384,
            "random_seed": 0,
            "skip_tokenizer_init": True,
            "dist_timeout": 120,
        }
        if args.model_path is None:
            Path(folder, "config.json").write_text(json.dumps(SMOL_LIKE))
            kwargs.update(model_path=folder, load_format="dummy")
            vocab = SMOL_LIKE["vocab_size"]
        else:
            if args.model_path != "default":
                kwargs["model_path"] = args.model_path
            vocab = 32000  # token ids below every supported vocabulary
        rng = random.Random(0)
        prompts = [
            [rng.randrange(3, vocab) for _ in range(args.input_len)]
            for _ in range(args.num_requests)
        ]
        results = []
        for layout in args.layouts:
            results.append(run_layout(layout, kwargs, prompts, args.max_new_tokens))
            logging.warning("%s done: %s", layout, results[-1])
    print(
        f"{args.num_requests} requests at once, {args.input_len} prompt tokens, "
        f"{args.max_new_tokens} output tokens each, {args.dtype}"
    )
    print(table(results))


if __name__ == "__main__":
    main()
