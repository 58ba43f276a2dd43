"""Cross-option rules of --enable-deterministic-inference (SGLang's: a request's tokens and
logprobs do not depend on the batch it lands in, on chunked-prefill boundaries or on a prefix
cache hit; with temperature > 0 when it carries `sampling_seed`).

On the CPU this holds where every reduction runs in an order fixed per row: radixserve's C++
kernels (the GGUF block kernels give a row the same bits at any batch size; attention runs
each query row as its own work item under the flag, kernels/csrc/attention.cpp; float weights
take the packed GEMM at every row count), the per-row norms and activations, and the sampler's
per-request seeded draws. PyTorch's reference attention (torch_native) batches rows through
BLAS, whose blocking changes with the row count, so it is refused, as is CUDA (no
batch-invariant kernels there yet).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from radixserve.options.errors import ServerArgsError

FLAG = "--enable-deterministic-inference"


def check_deterministic(v: Mapping[str, Any]) -> None:
    """Raise ServerArgsError for a setting the deterministic mode cannot run with."""
    if not v.get("enable_deterministic_inference"):
        return
    if v.get("device", "cpu") != "cpu":
        raise ServerArgsError(
            FLAG, f"runs on the CPU only (got --device {v.get('device')}): use --device cpu"
        )
    for dest in ("attention_backend", "prefill_attention_backend", "decode_attention_backend"):
        if v.get(dest) not in (None, "intel_amx"):
            option = "--" + dest.replace("_", "-")
            raise ServerArgsError(
                FLAG,
                f"needs the intel_amx attention kernels ({option} {v[dest]} batches rows "
                f"through BLAS): drop {option}",
            )
    if v.get("enable_torch_compile"):
        raise ServerArgsError(FLAG, "cannot be combined with --enable-torch-compile yet")
