"""Every C++ kernel with a PyTorch reference, declared once.

An entry names the extension's function (csrc/bindings.cpp), its PyTorch reference
(kernels/reference.py, whose typed signature is the op's schema), when the C++ kernel takes the
arguments (else the reference runs), how the extension is called where its binding differs
(in-place results, an empty tensor for "no bias"), and, for the ops torch.compile must not look
inside, the fake that gives dynamo their output shapes. kernels/ops.py makes the functions the
layers call from this table, and layers/compile_ops.py registers the opaque ones as
`torch.ops.radixserve.<name>`: adding an op is one entry here (and its C++ function).

Not here: paged_attention (its batch description is tensors for C++ and lists for the
reference, and windows choose between them: ops.py writes that wrapper out), and the kernels
without a PyTorch twin (the one-call decoder layer and chain, thread pinning, switches).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, ParamSpec, TypeVar

import torch

from radixserve.kernels import reference
from radixserve.kernels.build import load_extension

P = ParamSpec("P")
R = TypeVar("R")

NO_BIAS = torch.empty(0)  # the extension's "no bias" (its bindings take a Tensor, not None)


def _always(ext: object, *args: Any) -> bool:
    return True


def call_directly(kernel: Callable[..., Any], *args: Any) -> Any:
    return kernel(*args)


@dataclass(frozen=True)
class KernelOp(Generic[P, R]):
    """One kernel: the C++ function `name` and its PyTorch `reference` compute the same thing
    (up to float rounding; the self-test and unit tests compare them)."""

    name: str
    reference: Callable[P, R]
    # Whether the C++ kernel takes these arguments (shapes, strides, types); checked after the
    # extension is known to take the first argument's device and dtype (ops._ext).
    accepts: Callable[..., bool] = _always
    # How the extension's function is called with the op's arguments, where its binding
    # differs from the reference's signature.
    call_cpp: Callable[..., Any] = call_directly
    # Output shapes without running (torch.library fake): set for the ops compiled graphs keep
    # opaque, as torch.ops.radixserve.<name> (layers/compile_ops.py).
    fake: Callable[..., Any] | None = None
    # Under torch.compile, whether these arguments take the opaque op (else the reference is
    # traced, so inductor can fuse it).
    opaque_when: Callable[..., bool] = _always
    mutates: tuple[str, ...] = field(default=())  # arguments written in place

    @property
    def schema(self) -> str:
        """The op's torch.library schema, from the reference's typed signature."""
        from torch._library.infer_schema import infer_schema

        return infer_schema(self.reference, mutates_args=self.mutates)


@functools.cache
def runs_block_type(ext: object, qtype: int) -> bool:
    """Whether the built extension's integer kernels run GGML type `qtype` (fixed per build;
    cached because gguf_linear asks on every call)."""
    return bool(ext.gguf_kernel_type(qtype))  # type: ignore[attr-defined]


def _rows_2d_contiguous(ext: object, x: torch.Tensor, *args: Any) -> bool:
    return x.dim() == 2 and x.is_contiguous()


def _in_place_add_norm(
    kernel: Callable[..., Any],
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    # The C++ kernel reuses x and residual's memory for (normed, summed).
    kernel(x, residual, weight, eps)
    return x, residual


def _add_norm_accepts(ext: object, x: torch.Tensor, residual: torch.Tensor, *args: Any) -> bool:
    return x.dim() == 2 and x.is_contiguous() and residual.is_contiguous()


def _unit_stride_rows(ext: object, x: torch.Tensor, *args: Any) -> bool:
    return x.dim() == 2 and x.stride(1) == 1


def _logits_rows(ext: object, x: torch.Tensor) -> bool:
    return (
        x.dtype in (torch.float32, torch.bfloat16)
        and x.dim() == 2
        and x.stride(1) == 1
        and x.shape[1] > 0
    )


def _gguf_accepts(
    ext: object, x: torch.Tensor, blocks: torch.Tensor, qtype: int, out_features: int
) -> bool:
    return x.dim() == 2 and x.stride(1) == 1 and runs_block_type(ext, qtype)


def _gguf_argmax_accepts(
    ext: object, x: torch.Tensor, blocks: torch.Tensor, qtype: int, out_features: int, columns: int
) -> bool:
    return _gguf_accepts(ext, x, blocks, qtype, out_features) and 0 < columns <= out_features


def _gguf_fake(
    x: torch.Tensor, blocks: torch.Tensor, qtype: int, out_features: int
) -> torch.Tensor:
    return x.new_empty((x.shape[0], out_features))


def _half_weight_accepts(ext: object, x: torch.Tensor, weight: torch.Tensor, *args: Any) -> bool:
    return (
        x.dtype == torch.float32
        and x.dim() == 2
        and x.stride(1) == 1
        and x.shape[1] % 8 == 0
        and weight.is_contiguous()
        and bool(ext.half_weight_linear_available())  # type: ignore[attr-defined]
    )


def _with_bias_tensor(
    kernel: Callable[..., Any],
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    return kernel(x, weight, NO_BIAS if bias is None else bias)


_EMPTY: dict[torch.dtype, torch.Tensor] = {}


def _float_linear_cpp(
    kernel: Callable[..., Any],
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    # Any leading shape; the kernel takes rows and an empty bias of x's dtype for none.
    flat = x.reshape(-1, x.shape[-1])
    empty = _EMPTY.get(x.dtype)
    if empty is None:
        empty = _EMPTY.setdefault(x.dtype, torch.empty(0, dtype=x.dtype))
    out = kernel(flat, weight, empty if bias is None else bias)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def _same_dtype(ext: object, x: torch.Tensor, weight: torch.Tensor, *args: Any) -> bool:
    return x.dtype == weight.dtype


def _float_linear_fake(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.compiler.assume_constant_result
def _extension_built() -> bool:
    # A constant to dynamo: tracing into load_extension (the build's name hashes the sources
    # with hashlib, which dynamo cannot trace) broke every decoder layer's graph at its first
    # linear layer, and each layer's linears then compiled graphs of their own (26 for two
    # buckets where 2 are expected: test_compiled_decode_matches_eager).
    return load_extension() is not None


def _float_linear_opaque(x: torch.Tensor, weight: torch.Tensor, *args: Any) -> bool:
    # The packed kernel only where it is built and the dtypes match; else inductor's matmul.
    return (
        x.dtype == weight.dtype
        and x.dtype in (torch.float32, torch.bfloat16)
        and _extension_built()
    )


RMS_NORM = KernelOp("rms_norm", reference.rms_norm, accepts=_rows_2d_contiguous)
FUSED_ADD_RMS_NORM = KernelOp(
    "fused_add_rms_norm",
    reference.fused_add_rms_norm,
    accepts=_add_norm_accepts,
    call_cpp=_in_place_add_norm,
)
SILU_AND_MUL = KernelOp("silu_and_mul", reference.silu_and_mul, accepts=_unit_stride_rows)
ARGMAX_ROWS = KernelOp("argmax_rows", reference.argmax_rows, accepts=_logits_rows)


# rope_store_kv's arguments before its two KV scales (q ... neox), and the scales' defaults.
_ROPE_STORE_ARGS = 11
_UNIT_KV_SCALES = (1.0, 1.0)


def _rope_store_cpp(kernel: Callable[..., Any], *args: Any) -> None:
    # The binding takes the KV scales always (1 for float caches); the reference defaults them.
    kernel(*args, *_UNIT_KV_SCALES[len(args) - _ROPE_STORE_ARGS :])


ROPE_STORE_KV = KernelOp(
    "rope_store_kv",
    reference.rope_store_kv,
    call_cpp=_rope_store_cpp,
    mutates=("q", "k", "k_cache", "v_cache"),
)
GGUF_LINEAR = KernelOp("gguf_linear", reference.gguf_linear, accepts=_gguf_accepts, fake=_gguf_fake)
GGUF_LINEAR_ARGMAX = KernelOp(
    "gguf_linear_argmax", reference.gguf_linear_argmax, accepts=_gguf_argmax_accepts
)
HALF_WEIGHT_LINEAR = KernelOp(
    "half_weight_linear",
    reference.half_weight_linear,
    accepts=_half_weight_accepts,
    call_cpp=_with_bias_tensor,
)
# F.linear is the reference: the packed kernel runs from the row count ops.tune_float_gemm
# chose, at::linear below it, so both are the same matmul. Under torch.compile the kernel stays
# opaque: the BLAS inductor would call runs 2.5-3.5x slower at decode's 2-16 rows on AMD CPUs.
FLOAT_LINEAR = KernelOp(
    "float_linear",
    reference.float_linear,
    accepts=_same_dtype,
    call_cpp=_float_linear_cpp,
    fake=_float_linear_fake,
    opaque_when=_float_linear_opaque,
)

TABLE: tuple[KernelOp[..., Any], ...] = (
    RMS_NORM,
    FUSED_ADD_RMS_NORM,
    SILU_AND_MUL,
    ARGMAX_ROWS,
    ROPE_STORE_KV,
    GGUF_LINEAR,
    GGUF_LINEAR_ARGMAX,
    HALF_WEIGHT_LINEAR,
    FLOAT_LINEAR,
)
