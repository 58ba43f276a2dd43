"""The dtype layers store their big weights in, when it differs from the compute dtype.

A bfloat16/float16 checkpoint served in float32 (--dtype auto on a CPU without bf16 arithmetic,
or --dtype float32) keeps its linear weights and embedding table 16-bit: the loader builds the
model inside `stored_weights(dtype)`, linear layers widen weights as they multiply
(kernels.ops.half_weight_linear, exact per value) and the embedding widens the rows it looks up.
Everything else (norms, biases, activations, KV) stays in the compute dtype.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

import torch

HALF_DTYPES = (torch.bfloat16, torch.float16)

_STORED: ContextVar[torch.dtype | None] = ContextVar("stored_weight_dtype", default=None)


@contextlib.contextmanager
def stored_weights(dtype: torch.dtype | None) -> Iterator[None]:
    """Layers built inside store their weights in `dtype` (None: the default dtype)."""
    if dtype is not None and dtype not in HALF_DTYPES:
        raise ValueError(f"weights can be stored in {HALF_DTYPES}, not {dtype}")
    token = _STORED.set(dtype)
    try:
        yield
    finally:
        _STORED.reset(token)


def weight_dtype() -> torch.dtype:
    """The dtype a layer being built gives its weight."""
    return _STORED.get() or torch.get_default_dtype()


def widened(weight: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether `weight` is stored narrower than the activations it multiplies."""
    return weight.dtype in HALF_DTYPES and dtype == torch.float32
