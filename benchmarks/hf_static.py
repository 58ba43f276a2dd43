"""HF transformers anchor for benchmarks/compare.py: static batching with model.generate.

    .venv/bin/python benchmarks/hf_static.py --model path/to/model.gguf --dtype bfloat16 \
        --concurrency 8 --num-prompts 16 --input-len 128 --output-len 128 --output-file out.jsonl

Loads the model through transformers in --dtype (a GGUF dequantized, a Hugging Face folder as
is), builds random prompts of exactly
--input-len token ids, and runs them in static batches of --concurrency with greedy decoding and
min_new_tokens = max_new_tokens = --output-len, so every request yields --output-len tokens. A
batch starts when the previous one ends (no continuous batching): each request's latency is its
batch's wall time, and its time to first token is the batch's prefill (the first call of the
stopping criteria after the forward pass over the prompts).

Appends one JSON line to --output-file with the field names of SGLang's bench_serving
(output_throughput, request_throughput, mean_ttft_ms, mean_tpot_ms, mean_e2e_latency_ms, ...).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass
class BatchTiming:
    size: int
    ttft_s: float
    e2e_s: float
    output_tokens: int


class FirstTokenClock:
    """A stopping criterion that never stops and records when the first token came out."""

    def __init__(self) -> None:
        self.start = 0.0
        self.first: float | None = None

    def reset(self) -> None:
        self.start = time.perf_counter()
        self.first = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **_: Any) -> torch.Tensor:
        if self.first is None:
            self.first = time.perf_counter()
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # --gguf: the name from when only GGUF files were taken, kept for old command lines.
    parser.add_argument(
        "--model", "--gguf", required=True, help="a .gguf file or a Hugging Face model folder"
    )
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--concurrency", type=int, default=1, help="static batch size")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up batches (not timed)")
    parser.add_argument("--output-file", type=Path, default=None)
    return parser.parse_args(argv)


def pretrained_source(model: Path) -> tuple[str, dict[str, str]]:
    """from_pretrained's folder and keyword arguments for `model`: a GGUF file is named inside
    its folder (transformers' GGUF loader), a folder is loaded as it is."""
    if model.is_dir():
        return str(model), {}
    return str(model.parent), {"gguf_file": model.name}


def load_model(path: Path, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM

    folder, kwargs = pretrained_source(path)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kwargs)
    return model.eval()


def random_prompts(num: int, length: int, vocab: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    # Skip the lowest ids, where tokenizers keep their special tokens.
    return torch.randint(100, vocab, (num, length), generator=generator)


def run_batch(
    model: Any, prompts: torch.Tensor, output_len: int, clock: FirstTokenClock
) -> BatchTiming:
    clock.reset()
    with torch.inference_mode():
        out = model.generate(
            input_ids=prompts,
            attention_mask=torch.ones_like(prompts),
            max_new_tokens=output_len,
            min_new_tokens=output_len,
            do_sample=False,
            stopping_criteria=[clock],
            pad_token_id=0,
        )
    end = time.perf_counter()
    first = clock.first if clock.first is not None else end
    produced = (out.shape[1] - prompts.shape[1]) * prompts.shape[0]
    return BatchTiming(prompts.shape[0], first - clock.start, end - clock.start, produced)


def summarize(batches: list[BatchTiming], wall_s: float, output_len: int) -> dict[str, float]:
    """Per-request metrics with SGLang bench_serving's field names."""
    ttfts = [b.ttft_s * 1000 for b in batches for _ in range(b.size)]
    e2es = [b.e2e_s * 1000 for b in batches for _ in range(b.size)]
    tpots = [(e - t) / max(output_len - 1, 1) for e, t in zip(e2es, ttfts, strict=True)]
    completed = sum(b.size for b in batches)
    output_tokens = sum(b.output_tokens for b in batches)
    return {
        "completed": completed,
        "duration": wall_s,
        "total_output_tokens": output_tokens,
        "request_throughput": completed / wall_s,
        "output_throughput": output_tokens / wall_s,
        "mean_ttft_ms": statistics.fmean(ttfts),
        "median_ttft_ms": statistics.median(ttfts),
        "p99_ttft_ms": max(ttfts),
        "mean_tpot_ms": statistics.fmean(tpots),
        "mean_itl_ms": statistics.fmean(tpots),
        "mean_e2e_latency_ms": statistics.fmean(e2es),
        "median_e2e_latency_ms": statistics.median(e2es),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    load_start = time.perf_counter()
    model = load_model(Path(args.model), dtype)
    load_s = time.perf_counter() - load_start
    prompts = random_prompts(args.num_prompts, args.input_len, model.config.vocab_size, args.seed)
    clock = FirstTokenClock()
    for _ in range(args.warmup):
        run_batch(model, prompts[: args.concurrency], min(args.output_len, 8), clock)
    batches: list[BatchTiming] = []
    start = time.perf_counter()
    for first in range(0, args.num_prompts, args.concurrency):
        batch = prompts[first : first + args.concurrency]
        batches.append(run_batch(model, batch, args.output_len, clock))
    wall_s = time.perf_counter() - start
    result: dict[str, Any] = {
        "backend": f"hf-{args.dtype}",
        "max_concurrency": args.concurrency,
        "num_prompts": args.num_prompts,
        "random_input_len": args.input_len,
        "random_output_len": args.output_len,
        "load_seconds": load_s,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "torch_threads": torch.get_num_threads(),
        **summarize(batches, wall_s, args.output_len),
    }
    if args.output_file is not None:
        with args.output_file.open("a") as fh:
            fh.write(json.dumps(result) + "\n")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
