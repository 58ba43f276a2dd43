"""The cost of Gemma 3's bidirectional image-token attention (layers/attention/bidirectional.py)
beside the causal C++ paged-attention kernel: one layer of gemma-3-4b-shaped prefill attention
(8 query heads, 4 KV heads, head_dim 256) for a prompt of `--tokens` tokens that holds one
256-token image, on one thread. The masked path recomputes, in PyTorch, the rows of the
requests that carry image tokens after the kernel has run them causally.

    python benchmarks/image_block_attention.py [--tokens 300] [--repeats 20]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from types import SimpleNamespace

import torch

from radixserve.kernels import ops
from radixserve.layers.attention.bidirectional import recompute_block_rows
from radixserve.model_executor.forward_batch import ForwardMode

HEADS, KV_HEADS, HEAD_DIM, IMAGE = 8, 4, 256, 256


def _ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    n = args.tokens
    torch.manual_seed(0)
    torch.set_num_threads(1)
    k_buf = torch.randn(n, KV_HEADS, HEAD_DIM)
    v_buf = torch.randn(n, KV_HEADS, HEAD_DIM)
    req_to_token = torch.arange(n).view(1, n)
    q = torch.randn(n, HEADS * HEAD_DIM)
    scale = HEAD_DIM**-0.5
    meta = ops.PagedMeta.build([0], [0], [n])
    kv = SimpleNamespace(get_kv=lambda layer: (k_buf, v_buf), scales=lambda layer: (1.0, 1.0))
    layer = SimpleNamespace(
        layer_id=0,
        num_heads=HEADS,
        head_dim=HEAD_DIM,
        scaling=scale,
        sliding_window=None,
        logit_cap=None,
        sinks=None,
    )
    batch = SimpleNamespace(
        bidirectional_blocks=((min(20, n - IMAGE), IMAGE),),
        forward_mode=ForwardMode.EXTEND,
        kv_cache=kv,
        extend_seq_lens_cpu=[n],
        extend_prefix_lens_cpu=[0],
        req_pool_indices_cpu=[0],
        req_to_token=req_to_token,
    )
    causal = _ms(
        lambda: ops.paged_attention(
            q, k_buf, v_buf, req_to_token, meta, HEADS, scale, None, None, None, 1.0, 1.0
        ),
        args.repeats,
    )
    out = torch.empty(n, HEADS * HEAD_DIM)
    masked = _ms(lambda: recompute_block_rows(out, q, layer, batch), args.repeats)  # type: ignore[arg-type]
    kernels = "C++" if ops.using_cpp_kernels() else "PyTorch reference"
    print(f"{n} tokens, one {IMAGE}-token image, 1 thread, {kernels} kernels")
    print(
        f"causal paged attention: {causal:.2f} ms/layer; masked recompute: +{masked:.2f} ms/layer"
    )


if __name__ == "__main__":
    main()
