"""Host time per decode step (everything in Scheduler.step outside the model forward).

Runs the default model in-process (runtime="thread"), sends `--batch` greedy requests at once
and, for every decode step that holds the whole batch, times the scheduler's step and the
ModelRunner.forward inside it with time.perf_counter. Host time = step - forward: scheduling,
slot allocation, input building, sampling and output processing.

    python benchmarks/decode_host_time.py --batch 64 --new-tokens 64
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from radixserve.entrypoints.engine import Engine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    args = ap.parse_args()
    kwargs: dict[str, Any] = {"runtime": "thread"}
    if args.model_path:
        kwargs["model_path"] = args.model_path
    with Engine(**kwargs) as engine:
        sched = engine.scheduler
        runner = sched.step_runner.runner
        steps: list[tuple[float, float]] = []
        fwd: list[float] = []
        orig_forward = runner.forward
        orig_step = sched.step_and_stash

        def timed_forward(*a: Any, **k: Any) -> Any:
            tic = time.perf_counter()
            out = orig_forward(*a, **k)
            fwd.append(time.perf_counter() - tic)
            return out

        def timed_step() -> None:
            fwd.clear()
            decoding = len(sched.running) == args.batch and not sched.waiting
            tic = time.perf_counter()
            orig_step()
            total = time.perf_counter() - tic
            if decoding and len(fwd) == 1:
                steps.append((total, fwd[0]))

        runner.forward = timed_forward  # type: ignore[method-assign]
        sched.step_and_stash = timed_step  # type: ignore[method-assign]
        params = {"temperature": 0, "max_new_tokens": args.new_tokens, "ignore_eos": True}
        prompts = [
            [(7 * i + j) % 1000 + 10 for j in range(args.prompt_len)] for i in range(args.batch)
        ]
        engine.generate(input_ids=prompts, sampling_params=params)
    steps = steps[2:]  # first decode steps warm caches
    total = statistics.median(s for s, _ in steps)
    forward = statistics.median(f for _, f in steps)
    host = statistics.median(s - f for s, f in steps)
    print(
        f"decode steps at batch {args.batch}: {len(steps)}; median step {total * 1e3:.2f} ms, "
        f"forward {forward * 1e3:.2f} ms, host {host * 1e3:.3f} ms ({100 * host / total:.1f}% of the step)"
    )


if __name__ == "__main__":
    main()
