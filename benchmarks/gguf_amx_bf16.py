"""gguf_linear on bfloat16 rows: AMX-BF16 tiles (csrc/gguf_gemm_amx.cpp) against the float32
tiles it replaces (csrc/gguf_gemm_tiled.cpp), on SmolLM2-135M's Q4_1/Q8_0 shapes, interleaved
in one process (best of --repeats each), with random blocks of the right types. A third column
times the integer kernel (the many-row path off, as under --enable-deterministic-inference),
which gguf_linear runs below its row thresholds (AMX: 12 rows; float tiles: Q4_1 12, Q8_0 32):
at 16 rows the Q8_0 fp32 column times the integer kernel.

    python benchmarks/gguf_amx_bf16.py --rows 16 64 128 --repeats 20

The machine may be shared: run it twice and read the spread, not one number.
"""

from __future__ import annotations

import argparse
import time

import torch

from radixserve.kernels import ops
from radixserve.kernels.build import load_extension
from radixserve.kernels.reference import BLOCK_BYTES, GGML_Q4_1, GGML_Q8_0

# (name, GGML type, out features N, in features K) of one SmolLM2-135M decoder layer and its
# LM head; gate and up are two matmuls of the same shape.
SHAPES = (
    ("gate/up Q4_1 576->1536", GGML_Q4_1, 1536, 576),
    ("down Q4_1 1536->576", GGML_Q4_1, 576, 1536),
    ("attn Q8_0 576->576", GGML_Q8_0, 576, 576),
    ("lm_head Q8_0 576->49152", GGML_Q8_0, 49152, 576),
)
PATHS = ("int", "fp32", "amx")


def random_blocks(qtype: int, n: int, k: int) -> torch.Tensor:
    """[n, k / 32 * bytes] blocks of random quants with small fp16 scales (and mins)."""
    raw = torch.randint(0, 256, (n, k // 32, BLOCK_BYTES[qtype]), dtype=torch.uint8)
    scales = (torch.rand(n, k // 32, 2) * 0.02).to(torch.float16).view(torch.uint8)
    raw[..., 0:4] = scales.reshape(n, k // 32, 4)
    return raw.reshape(n, -1).contiguous()


def best_ms(args: tuple[torch.Tensor, torch.Tensor, int, int], repeats: int) -> float:
    """The fastest of `repeats` gguf_linear(*args) calls, in milliseconds."""
    best = float("inf")
    for _ in range(repeats):
        tic = time.perf_counter()
        ops.gguf_linear(*args)
        best = min(best, time.perf_counter() - tic)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 64, 128])
    ap.add_argument("--repeats", type=int, default=20, help="timed calls per path and round")
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the two paths")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    ext = load_extension()
    if ext is None or not ext.gguf_tiled_amx_available():
        raise SystemExit("needs the C++ kernels with AMX-BF16 (built, and granted by the OS)")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"threads {torch.get_num_threads()}; best of {args.repeats} x {args.rounds} rounds")
    print(f"{'shape':26} {'rows':>4} {'int ms':>8} {'fp32 ms':>9} {'amx ms':>9} {'amx/fp32':>8}")
    for name, qtype, n, k in SHAPES:
        blocks = random_blocks(qtype, n, k)
        for rows in args.rows:
            x = torch.randn(rows, k).to(torch.bfloat16)
            times = dict.fromkeys(PATHS, float("inf"))
            for _ in range(args.rounds):
                for path in PATHS:
                    ext.set_gguf_tiled_enabled(path != "int")
                    ops.set_gguf_amx_bf16(path == "amx")
                    ops.gguf_linear(x, blocks, qtype, n)  # warm-up: panels, caches
                    times[path] = min(
                        times[path],
                        best_ms((x, blocks, qtype, n), args.repeats),
                    )
            ext.set_gguf_tiled_enabled(True)
            ops.set_gguf_amx_bf16(True)
            print(
                f"{name:26} {rows:>4} {times['int']:>8.3f} {times['fp32']:>9.3f} "
                f"{times['amx']:>9.3f} {times['fp32'] / times['amx']:>7.2f}x"
            )


if __name__ == "__main__":
    main()
