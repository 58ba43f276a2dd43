"""KV bytes per token and decode speed at several context lengths for each --kv-cache-dtype.

    python benchmarks/kv_cache_dtypes.py [--contexts 1000 4000 8000] [--output-len 33]
        [-- extra bench_one_batch / serve options, e.g. --model-path X]

One bench_one_batch process per KV dtype (float32, bfloat16, fp8_e4m3 by default; float32
activations throughout, batch 1): a prefill of each context length, then output_len - 1 decode
steps whose median and fastest step are reported (the fastest is the one least disturbed
on a shared machine). Prints a markdown table (docs/performance.md, "KV cache
dtypes"). Each process loads the model once and runs the contexts in order.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

# --kv-cache-dtype value per row label ("auto" follows --dtype float32).
KV_DTYPES = {"float32": "auto", "bfloat16": "bf16", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
BYTES = {"float32": 4, "bfloat16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}


def run(label: str, contexts: list[int], output_len: int, extra: list[str]) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "result.jsonl"
        command = [
            sys.executable,
            "-m",
            "radixserve.bench_one_batch",
            "--dtype",
            "float32",
            "--kv-cache-dtype",
            KV_DTYPES[label],
            "--batch-size",
            "1",
            "--input-len",
            *map(str, contexts),
            "--output-len",
            str(output_len),
            "--max-total-tokens",
            str(max(contexts) + output_len + 64),
            "--run-name",
            label,
            "--result-filename",
            str(results),
            *extra,
        ]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        return [json.loads(line) for line in results.read_text().splitlines()]


def attention_times(contexts: list[int], dtypes: list[str], rounds: int = 5) -> dict:
    """Per decode step, the paged_attention calls of all layers alone (one request, one new
    token, SmolLM2-135M's 9 query / 3 KV heads of 64, 30 layers): the fastest of `rounds`
    interleaved rounds of 20 calls each, in milliseconds. Far less noisy on a shared machine
    than whole decode steps, and the part the KV dtype changes."""
    import time

    import torch

    from radixserve.kernels import build, kv_codes

    ext = build.load_extension()
    if ext is None:
        raise SystemExit("the C++ kernels are not built")
    torch_dtypes = {
        "float32": torch.float32,
        "bfloat16": torch.bfloat16,
        "fp8_e4m3": torch.float8_e4m3fn,
        "fp8_e5m2": torch.float8_e5m2,
    }
    heads, kv_heads, dim, layers = 9, 3, 64, 30
    best: dict = {}
    for context in contexts:
        slots = torch.randperm(context + 1)[None, :]  # scattered slots, as a pool hands out
        args = {}
        for label in dtypes:
            values = torch.randn(2, context + 1, kv_heads, dim)
            caches = kv_codes.encode(values, torch_dtypes[label])
            args[label] = (caches[0].contiguous(), caches[1].contiguous())
        q = torch.randn(1, heads * dim)
        meta = [torch.tensor([v]) for v in (0, context, 1, 0)]
        for _ in range(rounds):
            for label in dtypes:
                k, v = args[label]
                tic = time.perf_counter()
                for _ in range(20):
                    ext.paged_attention(q, k, v, slots, *meta, heads, 0.125, 1.0, 1.0)
                ms = (time.perf_counter() - tic) / 20 * layers * 1e3
                key = (label, context)
                best[key] = min(best.get(key, ms), ms)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1000, 4000, 8000])
    parser.add_argument("--output-len", type=int, default=33)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "fp8_e4m3"])
    parser.add_argument("--layers-heads-dim", type=int, nargs=3, default=[30, 3, 64])
    parser.add_argument(
        "--attention-only",
        action="store_true",
        help="time the decode attention kernel alone (attention_times), not whole steps",
    )
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    layers, heads, dim = args.layers_heads_dim
    if args.attention_only:
        best = attention_times(args.contexts, args.dtypes)
        print(
            "| KV dtype | " + " | ".join(f"attention ms/step @ {c}" for c in args.contexts) + " |"
        )
        print("|---" * (1 + len(args.contexts)) + "|")
        for label in args.dtypes:
            cells = [f"{best[(label, c)]:.2f}" for c in args.contexts]
            print(f"| {label} | " + " | ".join(cells) + " |")
        return
    header = "| KV dtype | KV bytes/token | " + " | ".join(
        f"decode tok/s @ {c} (median / best step)" for c in args.contexts
    )
    print(header + " |")
    print("|---" * (2 + len(args.contexts)) + "|")
    for label in args.dtypes:
        records = {r["input_len"]: r for r in run(label, args.contexts, args.output_len, extra)}
        per_token = 2 * layers * heads * dim * BYTES[label]
        speeds = [
            f"{records[c]['median_decode_throughput']:.1f} / {1 / records[c]['min_decode_latency']:.1f}"
            if c in records
            else "skipped"
            for c in args.contexts
        ]
        print(f"| {label} | {per_token} | " + " | ".join(speeds) + " |", flush=True)


if __name__ == "__main__":
    main()
