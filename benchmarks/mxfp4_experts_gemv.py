"""Time one MoE layer's chosen experts at batch 1 (GEMV) on MXFP4 blocks against the same
experts decoded to bfloat16, as FusedMoE runs them (layers/moe/methods.py).

gpt-oss-20b's expert shape by default (hidden 2880, intermediate 2880, top-4): each pass runs
gate|up and down of `--top-k` experts for one row, the passes alternating between disjoint sets
of experts so the weights come from memory, not cache. Forms:
- mxfp4: GGUFExpertsMethod on block_mxfp4 (the C++ integer kernel, float32 or bfloat16 rows);
- bf16: UnquantizedExpertsMethod on the decoded bfloat16 weights with bfloat16 rows (the model
  under --dtype bfloat16 before MXFP4 was kept) and with float32 rows (weights widened per call).
Prints the median and best of `--repeats` rounds (the forms interleaved in each) and the expert bytes read per second.

    python benchmarks/mxfp4_experts_gemv.py --experts 8 --repeats 30
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace

import torch

from radixserve.kernels import ops
from radixserve.layers.moe.methods import (
    ExpertBlocks,
    GGUFExpertsMethod,
    UnquantizedExpertsMethod,
)
from radixserve.layers.quantization.mxfp4 import dequantize_mxfp4
from radixserve.models.gpt_oss_blocks import repack_stack

MXFP4 = 39


def _random_checkpoint(experts: int, out: int, k: int, gen: torch.Generator) -> tuple:
    blocks = torch.randint(0, 256, (experts, out, k // 32, 16), generator=gen, dtype=torch.uint8)
    scales = torch.randint(118, 124, (experts, out, k // 32), generator=gen, dtype=torch.uint8)
    return blocks, scales


def _time_interleaved(
    runs: dict[str, Callable[[list[int]], None]], sets: list[list[int]], repeats: int
) -> dict[str, list[float]]:
    """Each form once per round, the rounds repeated: on a shared machine every form sees the
    same background load, so their ratios hold where the absolute times wander."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():  # warm up: first-call allocations, the kernels' threads
        run(sets[0])
    for i in range(repeats):
        for name, run in runs.items():
            tic = time.perf_counter()
            run(sets[i % len(sets)])
            times[name].append(time.perf_counter() - tic)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=2880)
    ap.add_argument("--inter", type=int, default=2880)
    ap.add_argument("--experts", type=int, default=8, help="experts held (sets of --top-k)")
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not ops.gguf_kernel_type(MXFP4):
        print("note: no C++ kernel for MXFP4 here; the mxfp4 rows time the PyTorch fallback")
    gen = torch.Generator().manual_seed(0)
    h, i, e = args.hidden, args.inter, args.experts
    gu = _random_checkpoint(e, 2 * i, h, gen)
    dn = _random_checkpoint(e, h, i, gen)
    blocks = GGUFExpertsMethod(
        (ExpertBlocks(repack_stack(*gu, gate_up=True), MXFP4, 2 * i),),
        ExpertBlocks(repack_stack(*dn, gate_up=False), MXFP4, h),
    )
    layer = SimpleNamespace(
        w13_weight=torch.stack(
            [dequantize_mxfp4(gu[0][x], gu[1][x], torch.bfloat16) for x in range(e)]
        ),
        w2_weight=torch.stack(
            [dequantize_mxfp4(dn[0][x], dn[1][x], torch.bfloat16) for x in range(e)]
        ),
    )
    float_method = UnquantizedExpertsMethod()
    sets = [list(range(s, s + args.top_k)) for s in range(0, e - args.top_k + 1, args.top_k)]
    per_expert = {"mxfp4": blocks.block_bytes() // e, "bf16": 2 * 3 * h * i}

    def runner(method: object, dtype: torch.dtype) -> Callable[[list[int]], None]:
        x = torch.randn(1, h, generator=gen).to(dtype)

        def run(chosen: list[int]) -> None:
            for expert in chosen:
                y = method.gate_up(layer, expert, x)
                method.down(layer, expert, y[:, :i].contiguous())

        return run

    print(
        f"hidden {h}, intermediate {i}, {args.top_k} of {e} experts a pass, "
        f"{torch.get_num_threads()} threads, best and median of {args.repeats}"
    )
    forms = {
        "mxfp4 blocks, float32 rows": (blocks, torch.float32, "mxfp4"),
        "mxfp4 blocks, bfloat16 rows": (blocks, torch.bfloat16, "mxfp4"),
        "decoded bf16, bfloat16 rows": (float_method, torch.bfloat16, "bf16"),
        "decoded bf16, float32 rows": (float_method, torch.float32, "bf16"),
    }
    runs = {name: runner(method, dtype) for name, (method, dtype, _) in forms.items()}
    for name, times in _time_interleaved(runs, sets, args.repeats).items():
        kind = forms[name][2]
        best, median = min(times), statistics.median(times)
        gbs = per_expert[kind] * args.top_k / median / 1e9
        print(
            f"{name:30s} best {best * 1e3:7.2f} ms  median {median * 1e3:7.2f} ms  "
            f"{gbs:5.1f} GB/s of expert weights ({per_expert[kind] * args.top_k / 1e6:.0f} MB)"
        )


if __name__ == "__main__":
    main()
