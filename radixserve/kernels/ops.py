"""The kernels the layers call: the C++ extension where it is built and passed its probe,
else the pure-PyTorch reference (radixserve/kernels/reference.py). Same signatures either way.
The ops with a reference are made from their declarations in kernels/op_table.py."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar, cast

import torch
import torch.nn.functional as F

from radixserve.kernels import op_table, reference
from radixserve.kernels.build import load_extension
from radixserve.kernels.op_table import KernelOp

P = ParamSpec("P")
R = TypeVar("R")

logger = logging.getLogger(__name__)


_KERNEL_DTYPES = (torch.float32, torch.bfloat16)


def _ext(t: torch.Tensor) -> object | None:
    """The extension when it can take `t` (CPU, float32 or bfloat16), else None. None while
    torch.compile traces (the extension's calls are opaque to dynamo: the traced model uses the
    PyTorch reference ops, and attention and GGUF matmuls go through layers/compile_ops.py)."""
    if t.device.type != "cpu" or t.dtype not in _KERNEL_DTYPES or torch.compiler.is_compiling():
        return None
    return load_extension()


def using_cpp_kernels() -> bool:
    return load_extension() is not None


def _dispatch(op: KernelOp[P, R]) -> Callable[P, R]:
    """The function layers call for table op `op` (kernels/op_table.py): the C++ kernel where
    the extension takes the arguments, else the PyTorch reference; under torch.compile the
    opaque torch.ops.radixserve op (layers/compile_ops.py) where the op has one, else the
    reference, which dynamo traces. Same signature and documentation as the reference.
    Positional arguments only: this runs ~10 times per layer per step module by module, so it
    does no more than the hand-written wrappers it replaced (~0.5 us a call)."""
    name, reference_fn, accepts, call_cpp = op.name, op.reference, op.accepts, op.call_cpp
    direct = call_cpp is op_table.call_directly
    opaque, opaque_when = op.fake is not None, op.opaque_when

    def call(*args: Any) -> Any:
        x = args[0]
        compiling = torch.compiler.is_compiling()
        if not compiling and x.device.type == "cpu" and x.dtype in _KERNEL_DTYPES:
            ext = load_extension()
            if ext is not None and accepts(ext, *args):
                kernel = getattr(ext, name)
                return kernel(*args) if direct else call_cpp(kernel, *args)
        elif compiling and opaque and opaque_when(*args):
            return getattr(torch.ops.radixserve, name)(*args)
        return reference_fn(*args)

    functools.update_wrapper(call, reference_fn)
    return cast("Callable[P, R]", call)


rms_norm = _dispatch(op_table.RMS_NORM)
# (rms_norm(x + residual), x + residual); the C++ kernel reuses x and residual's memory.
fused_add_rms_norm = _dispatch(op_table.FUSED_ADD_RMS_NORM)
silu_and_mul = _dispatch(op_table.SILU_AND_MUL)
# Greedy tokens: the C++ row-wise argmax (torch.argmax(dim=-1) ran ~1.6 GB/s here).
argmax_rows = _dispatch(op_table.ARGMAX_ROWS)
rope_store_kv = _dispatch(op_table.ROPE_STORE_KV)
gguf_linear = _dispatch(op_table.GGUF_LINEAR)
# Greedy sampling's LM head: argmax_rows(gguf_linear(...)[:, :columns]), the logits never
# written where the matmul runs on AMX tiles.
gguf_linear_argmax = _dispatch(op_table.GGUF_LINEAR_ARGMAX)
# float32 x @ W^T (+ bias) for a bfloat16/float16 weight, widened as it is multiplied (the C++
# kernel), else widened whole for F.linear.
half_weight_linear = _dispatch(op_table.HALF_WEIGHT_LINEAR)
# x @ W^T (+ bias) for a float weight on the fast path: the extension's float_linear (the
# packed kernel from the row count tune_float_gemm chose, else at::linear), as the fused layer
# computes it; F.linear without the extension.
float_linear = _dispatch(op_table.FLOAT_LINEAR)


@dataclass(frozen=True)
class PagedMeta:
    """Per-batch layout for paged_attention, as tensors (for C++) and lists (for PyTorch)."""

    req_pool_indices: torch.Tensor
    prefix_lens: torch.Tensor
    extend_lens: torch.Tensor
    q_starts: torch.Tensor
    req_pool_indices_list: list[int]
    prefix_lens_list: list[int]
    extend_lens_list: list[int]
    q_starts_list: list[int]

    @classmethod
    def build(
        cls, req_pool_indices: list[int], prefix_lens: list[int], extend_lens: list[int]
    ) -> PagedMeta:
        starts, total = [], 0
        for n in extend_lens:
            starts.append(total)
            total += n

        def t(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64)

        return cls(
            t(req_pool_indices),
            t(prefix_lens),
            t(extend_lens),
            t(starts),
            list(req_pool_indices),
            list(prefix_lens),
            list(extend_lens),
            starts,
        )


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    meta: PagedMeta,
    heads: int,
    scale: float,
    sliding_window: int | None = None,
    logit_cap: float | None = None,
    sinks: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Causal attention of each request's new tokens over its KV (see RadixAttention for
    `sliding_window`, `logit_cap` and `sinks`; an 8-bit cache holds K / k_scale and
    V / v_scale, which both paths widen as they read). The C++ kernel has no soft-capping: those
    layers take the PyTorch reference, and so does a window, except where the kernel sees
    exactly the window anyway (window_table: decode steps, and prompts no longer than the
    window). Sinks (gpt-oss) it adds to the softmax denominator (paged_attention_sinks)."""
    ext = _ext(q)
    if sinks is not None and not hasattr(ext, "paged_attention_sinks"):
        ext = None  # a build from before the sink term: the reference
    if ext is not None and logit_cap is None and sliding_window is not None:
        windowed = window_table(req_to_token, meta, sliding_window)
        if windowed is not None:
            req_to_token, meta = windowed
            sliding_window = None
    if ext is not None and sliding_window is None and logit_cap is None:
        args = (
            q,
            k_cache,
            v_cache,
            req_to_token,
            meta.req_pool_indices,
            meta.prefix_lens,
            meta.extend_lens,
            meta.q_starts,
            heads,
            scale,
        )
        if sinks is None:
            return ext.paged_attention(*args, k_scale, v_scale)
        sink_logits = sinks.to(torch.float32).contiguous()
        return ext.paged_attention_sinks(*args, sink_logits, k_scale, v_scale)
    return reference.paged_attention(
        q,
        k_cache,
        v_cache,
        req_to_token,
        meta.req_pool_indices_list,
        meta.prefix_lens_list,
        meta.extend_lens_list,
        meta.q_starts_list,
        heads,
        scale,
        sliding_window,
        logit_cap,
        sinks,
        k_scale,
        v_scale,
    )


def window_table(
    req_to_token: torch.Tensor, meta: PagedMeta, sliding_window: int
) -> tuple[torch.Tensor, PagedMeta] | None:
    """A request-to-token table and batch description under which plain causal attention is
    sliding-window attention, or None when there is none: each request's row starts at the
    oldest key its new token sees, which works where a request adds at most one token (a decode
    step: its one query sees exactly the window) or all its queries see every earlier key
    (prefix + new tokens within the window). Row i of the table is request i's."""
    starts: list[int] = []
    for prefix, new in zip(meta.prefix_lens_list, meta.extend_lens_list, strict=True):
        if new <= 1:
            starts.append(max(0, prefix - sliding_window + 1))
        elif prefix + new <= sliding_window:
            starts.append(0)
        else:
            return None
    prefixes = [p - s for p, s in zip(meta.prefix_lens_list, starts, strict=True)]
    lengths = [p + n for p, n in zip(prefixes, meta.extend_lens_list, strict=True)]
    width = max(max(lengths, default=0), 1)
    columns = torch.tensor(starts, dtype=torch.int64)[:, None] + torch.arange(width)[None, :]
    # Columns past a request's length are never read; clamped only to stay inside the table.
    columns = columns.clamp_(max=req_to_token.shape[1] - 1).to(req_to_token.device)
    rows = req_to_token.index_select(0, meta.req_pool_indices.to(req_to_token.device))
    table = rows.gather(1, columns).contiguous()
    batch = list(range(len(starts)))
    windowed = PagedMeta(
        torch.tensor(batch, dtype=torch.int64),
        torch.tensor(prefixes, dtype=torch.int64),
        meta.extend_lens,
        meta.q_starts,
        batch,
        prefixes,
        meta.extend_lens_list,
        meta.q_starts_list,
    )
    return table, windowed


def gguf_kernel_type(qtype: int) -> bool:
    """Whether the C++ kernels run GGML type `qtype` (else gguf_linear dequantizes tiles)."""
    ext = load_extension()
    return ext is not None and op_table.runs_block_type(ext, qtype)


def _packed_gain(ext: object, rows: int, rounds: int = 3) -> float:
    """torch's time over the packed kernel's on three decoder-like shapes at `rows` rows
    (interleaved, best of `rounds` each, summed)."""
    gen = torch.Generator().manual_seed(0)
    shapes = ((1536, 576), (576, 1536), (1024, 1024))  # (out, in) features
    pairs = [
        (torch.randn(rows, k, generator=gen), torch.randn(n, k, generator=gen)) for n, k in shapes
    ]
    best = {"torch": [float("inf")] * len(pairs), "packed": [float("inf")] * len(pairs)}
    for _ in range(rounds):
        for i, (x, w) in enumerate(pairs):
            for name, fn in (("torch", F.linear), ("packed", ext.float_linear_packed)):
                start = time.perf_counter()
                fn(x, w)
                best[name][i] = min(best[name][i], time.perf_counter() - start)
    return sum(best["torch"]) / sum(best["packed"])


def tune_float_gemm(min_gain: float = 1.1) -> str:
    """Decide once per process from which row count float32 matmuls use radixserve's packed
    kernel instead of torch's BLAS, by timing both at 128 rows (prefill), 4 rows (small decode
    batches) and 1 row: MKL is slow on AMD CPUs and fast on Intel ones, and no CPU flag says
    which. On this project's AMD machines MKL ran 2.5-3.3x slower than the packed kernel at 2-16
    rows (a quarter of the memory bandwidth on weights read from memory), 1.15x at 1 row and
    1.3x at 128. Returns a sentence for the startup log."""
    ext = load_extension()
    if ext is None or not ext.float_packed_available():
        return "float32 matmul: torch's BLAS (the packed kernel needs the C++ kernels and AVX2)"
    if _TUNED:
        return _TUNED[0]
    gains = {rows: _packed_gain(ext, rows) for rows in (128, 4, 1)}
    if gains[128] < min_gain:
        min_rows = 0  # never: the BLAS is at least as fast where the packing pays most
    elif gains[4] < min_gain:
        min_rows = FLOAT_PACKED_MIN_ROWS
    else:
        min_rows = 1 if gains[1] >= min_gain else 2
    ext.set_float_packed_min_rows(min_rows)
    measured = ", ".join(f"{gain:.2f}x at {rows} rows" for rows, gain in gains.items())
    if min_rows == 0:
        choice = "torch's BLAS"
    elif min_rows == 1:
        choice = "radixserve's packed AVX2 kernel at every row count"
    else:
        choice = f"radixserve's packed AVX2 kernel from {min_rows} rows"
    _TUNED.append(f"float32 matmul: {choice} (packed kernel measured {measured} of torch's)")
    return _TUNED[0]


ATTENTION_QUERY_ROWS = 8  # kQueryRows of csrc/attention.cpp: query rows per work item
PANEL_NEVER = 2**62


def use_deterministic_kernels(enabled: bool) -> None:
    """--enable-deterministic-inference: every kernel whose arithmetic for a row would depend
    on the other rows of its call takes one fixed path instead. Attention runs each query row
    as its own work item (prefill rows the same path as decode rows, wherever a chunk or a
    prefix-cache hit puts the boundaries); GGUF legacy blocks keep the integer path at every
    row count (no float tiles); K-quants keep one activation format (the int8 panel and AMX
    tiles equal the int8 per-row kernel bit for bit; without int8, the int16 per-row kernel
    everywhere); float32 weights take the packed kernel at every row count. (The batch-1 layer
    chain already gives a row the batched kernels' bits.)"""
    ext = load_extension()
    if ext is None:
        if enabled:
            raise ValueError(
                "--enable-deterministic-inference needs radixserve's C++ kernels, which are not "
                "built or were disabled here: build them (python -m radixserve.kernels.build)"
            )
        return
    ext.set_attention_query_rows(1 if enabled else ATTENTION_QUERY_ROWS)
    ext.set_gguf_tiled_enabled(not enabled)
    if not enabled:
        return
    if not ext.kquant_int8():
        ext.set_q8k_panel_min_rows(PANEL_NEVER)
    if ext.float_packed_available():
        ext.set_float_packed_min_rows(1)


def set_gguf_amx_bf16(enabled: bool) -> bool:
    """Whether gguf_linear runs 5 or more bfloat16 rows times Q4_1/Q8_0 weights on AMX-BF16
    tiles (csrc/gguf_gemm_amx.cpp; on by default where the build and the OS allow AMX) or, off,
    as before: the float32 tiles from 12 (Q4_1) / 32 (Q8_0) rows, the integer kernel below.
    Returns whether the tiles are now used
    (False without the C++ kernels or AMX-BF16). --enable-deterministic-inference turns the
    many-row path, and with it this one, off."""
    ext = load_extension()
    if ext is None:
        return False
    ext.set_gguf_tiled_amx_enabled(enabled)
    return bool(ext.gguf_tiled_amx_enabled())


# Where the packed kernel wins at 128 rows but not at 4: from this many rows its per-call panel
# packing is amortised.
FLOAT_PACKED_MIN_ROWS = 16
_TUNED: list[str] = []


def llama_layer(*args: object) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoder layer in the C++ extension (radixserve/kernels/csrc/fused_layer.cpp); only
    called where using_cpp_kernels() (the module-by-module path is its PyTorch equivalent)."""
    ext = load_extension()
    if ext is None:
        raise RuntimeError("llama_layer needs the C++ kernels")
    out, residual = ext.llama_layer(*args)
    return out, residual


def make_layer_chain(*flat_args: list[object]) -> object | None:
    """The extension's LlamaLayerChain (kernels.h: llama_layer's constant arguments of every
    layer, in flat lists), or None without the C++ kernels."""
    ext = load_extension()
    if ext is None or not hasattr(ext, "LlamaLayerChain"):
        return None
    return ext.LlamaLayerChain(*flat_args)


def run_layer_chain(chain: object, *args: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Every decoder layer in one C++ call (LlamaLayerChain.run; the same llama_layer calls as
    a Python loop over llama_layer, so the same results)."""
    out, residual = chain.run(*args)  # type: ignore[attr-defined]
    return out, residual


def bind_threads(cpus: list[int]) -> bool:
    """Pin PyTorch's OpenMP thread i to cpus[i]; False where the C++ kernels are not built (the
    pure-PyTorch fallback can only pin the whole process)."""
    ext = load_extension()
    if ext is None:
        return False
    return int(ext.bind_threads(cpus)) == len(cpus)
