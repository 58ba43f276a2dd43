"""What a speculative verify costs against a decode step, on one request.

    PYTHONPATH=. .venv/bin/python benchmarks/verify_cost.py --ks 2 4 8 --rounds 20 [serve options]

Loads the model with a ModelRunner (every `radixserve serve` option is accepted, e.g.
`--quantization gguf`, `--dtype float32`), prefills one request of --context random tokens, then
times, interleaved round by round, a decode step (one token) and extends of k tokens at the same
position with logits on every row (what a k-token verify runs), each through StepBuilder and
ModelRunner.forward as the serving step does. The slots past the context are rewritten each
time, so every step sees the same context. Prints the median of each and its ratio to decode.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence

import numpy as np

from radixserve.benchmarking.server_cli import configure_logging, new_parser, parse_with_server_args


def main(argv: Sequence[str] | None = None) -> int:
    parser = new_parser("verify_cost", __doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=200, help="tokens already in the KV")
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 4, 8], help="verify widths")
    parser.add_argument("--rounds", type=int, default=20)
    ns, server_args = parse_with_server_args(parser, argv)
    configure_logging(server_args.log_level)
    from radixserve.mem_cache.allocator import TokenToKVPoolAllocator
    from radixserve.mem_cache.req_to_token_pool import ReqToTokenPool
    from radixserve.model_executor.model_runner import ModelRunner
    from radixserve.model_executor.step_builder import StepBuilder

    runner = ModelRunner(server_args)
    widest = max([1, *ns.ks])
    allocator = TokenToKVPoolAllocator(ns.context + widest, server_args.page_size, runner.device)
    pool = ReqToTokenPool(1, runner.model_config.context_len, runner.device)
    row = pool.alloc()
    assert row is not None
    slots = allocator.alloc(ns.context + widest)
    assert slots is not None
    pool.write(row, 0, slots)
    rng = np.random.default_rng(server_args.random_seed)
    ids = rng.integers(0, min(runner.model_config.vocab_size, 10000), ns.context + widest).tolist()

    def step(prefix: int, n: int, logits: str) -> float:
        builder = StepBuilder()
        builder.add(row, prefix, ids[prefix : prefix + n], logits=logits)  # type: ignore[arg-type]
        inputs = builder.build(slot_table=pool.req_to_token, is_decode=n == 1)
        start = time.perf_counter()
        runner.forward(inputs, pool.req_to_token)
        return time.perf_counter() - start

    step(0, ns.context, "last")  # the context's KV
    widths = [1, *ns.ks]
    for k in widths:  # warm-up: first runs of a shape
        step(ns.context, k, "all")
    times: dict[int, list[float]] = {k: [] for k in widths}
    for _ in range(ns.rounds):
        for k in widths:
            times[k].append(step(ns.context, k, "all"))
    decode = statistics.median(times[1])
    print(f"context {ns.context} tokens, median of {ns.rounds} interleaved rounds")
    print(f"{'width':>6} {'ms':>9} {'x decode':>9}")
    for k in widths:
        ms = statistics.median(times[k]) * 1e3
        print(f"{k:>6} {ms:>9.2f} {ms / (decode * 1e3):>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
