"""Per-step overhead of grammar-constrained decoding versus unconstrained, side by side.

    .venv/bin/python benchmarks/bench_grammar.py --batch-sizes 1 32 --backends xgrammar llguidance

Both runs decode the same number of steps (the constrained output, 200 space-separated digits,
cannot end within max_new_tokens, so constrained requests run as long as free ones), in one
process, one after the other per batch size, so the difference per step is the cost of masks
and matcher updates.
"""

from __future__ import annotations

import argparse
import logging
import time

from tqdm import tqdm

from radixserve import Engine

# At least 200 tokens long, so no constrained request finishes before the free ones.
REGEX = r"( [0-9]){200}"


def run(engine: Engine, bs: int, steps: int, constrained: bool) -> float:
    """Seconds per decode step for `bs` requests generating `steps` tokens each."""
    params = {"max_new_tokens": steps, "temperature": 0.8, "sampling_seed": 0}
    if constrained:
        params["regex"] = REGEX
    else:
        params["ignore_eos"] = True
    prompts = [f"List some numbers ({i}):" for i in range(bs)]
    engine.generate(prompts, {**params, "max_new_tokens": 1})  # compile + warm the cache
    start = time.perf_counter()
    results = engine.generate(prompts, params)
    elapsed = time.perf_counter() - start
    longest = max(r["meta_info"]["completion_tokens"] for r in results)
    return elapsed / max(longest, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--backends", nargs="+", default=["xgrammar"])
    parser.add_argument("--steps", type=int, default=48)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    for backend in args.backends:
        with Engine(runtime="thread", grammar_backend=backend, max_total_tokens=16384) as engine:
            for bs in tqdm(args.batch_sizes, desc=backend):
                free = run(engine, bs, args.steps, constrained=False)
                constrained = run(engine, bs, args.steps, constrained=True)
                tqdm.write(
                    f"{backend:10s} bs={bs:3d}: free {1e3 * free:7.1f} ms/step, constrained "
                    f"{1e3 * constrained:7.1f} ms/step, overhead {1e3 * (constrained - free):+6.1f} "
                    f"ms/step ({100 * (constrained / free - 1):+.0f}%)"
                )


if __name__ == "__main__":
    main()
