"""Child process of the `--dtype auto` choice (radixserve/utils/auto_dtype.py): times the float
matmul the model runs (kernels.ops.float_linear; bfloat16 weights pre-packed for oneDNN where
the CPU allows, as layers/fast_path.py does) in float32 and in bfloat16 on decoder-like
shapes, checks the bfloat16 results, and prints one JSON line.

Run in a child because a CPU flag is not proof: a kernel the flags promise may still die with an
illegal instruction on a given machine (seen with llama.cpp's AMX kernel), and a BF16 path that
runs may still be slower than float32 (eager bf16 matmuls that re-pack their weights every
call). An illegal instruction here kills only the child.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from radixserve.kernels import ops
from radixserve.kernels.onednn_linear import onednn_linear, pack_weight, packing_support

# (out, in) features of the default model's projections; rows: one decode request, a decode
# batch, a prefill chunk.
SHAPES = ((1536, 576), (576, 1536))
ROWS = (1, 32, 128)
REPEATS = 7


def _model_matmul(x: torch.Tensor, w: torch.Tensor, packed_bf16: bool) -> Callable[[], Any]:
    """x @ w^T as the model's linear layers compute it: bfloat16 weights pre-packed for oneDNN
    where it can, else kernels.ops.float_linear."""
    if packed_bf16 and w.dtype == torch.bfloat16:
        weight = pack_weight(w)
        return lambda: onednn_linear(x, weight, None)
    return lambda: ops.float_linear(x, w)


def measure() -> dict[str, float]:
    ops.tune_float_gemm()  # the float32 path the model would take
    packed_bf16 = packing_support(torch.bfloat16)[0]  # and the bfloat16 one (layers/fast_path.py)
    gen = torch.Generator().manual_seed(0)
    times = {"float32": 0.0, "bfloat16": 0.0}
    worst = 0.0
    for rows in ROWS:
        for n, k in SHAPES:
            x = torch.randn(rows, k, generator=gen)
            w = torch.randn(n, k, generator=gen) * k**-0.5
            exact = x.double() @ w.double().T
            for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
                matmul = _model_matmul(x.to(dtype), w.to(dtype), packed_bf16)
                out = matmul()
                if name == "bfloat16":
                    err = (out.double() - exact).norm() / exact.norm()
                    worst = max(worst, float(err))
                samples = []
                for _ in range(REPEATS):
                    start = time.perf_counter()
                    matmul()
                    samples.append(time.perf_counter() - start)
                times[name] += statistics.median(samples)
    return {"float32_s": times["float32"], "bfloat16_s": times["bfloat16"], "bf16_rel_err": worst}


def main() -> None:
    print(json.dumps(measure()))


if __name__ == "__main__":
    main()
