"""Options: Mamba state caches and linear attention."""

from __future__ import annotations

from radixserve.options.choices import (
    LINEAR_ATTN_BACKEND_CHOICES,
    LINEAR_ATTN_VERIFY_BACKEND_CHOICES,
)
from radixserve.options.spec import NOT_APPLICABLE, OptionSpec, flag, value
from radixserve.options.value_types import FLOAT, INT, STR

AREA = "Mamba and linear attention"

OPTIONS: tuple[OptionSpec, ...] = (
    value("--max-mamba-cache-size", INT, None, "Maximum size of the Mamba state cache."),
    value(
        "--mamba-ssm-dtype",
        STR,
        None,
        "dtype of Mamba SSM states.",
        choices=("float32", "bfloat16", "float16"),
    ),
    value(
        "--mamba-max-states-per-path",
        INT,
        -1,
        "Cached Mamba states kept per radix path (-1: unlimited).",
    ),
    flag("--enable-mamba-cache-stochastic-rounding", "Stochastic rounding of FP16 Mamba states."),
    value("--mamba-cache-philox-rounds", INT, 0, "Philox rounds for stochastic rounding."),
    value(
        "--mamba-full-memory-ratio", FLOAT, 0.9, "Ratio of Mamba state memory to full KV memory."
    ),
    value(
        "--mamba-radix-cache-strategy",
        STR,
        "auto",
        "Radix cache strategy for Mamba models.",
        choices=("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"),
    ),
    value(
        "--mamba-track-interval",
        INT,
        256,
        "Interval at which Mamba states are tracked during decode.",
    ),
    flag("--enable-int8-mamba-checkpoint", "Store cached Mamba states in int8."),
    value("--int8-mamba-ckpt-size", INT, None, "Number of int8 Mamba checkpoint slots."),
    value(
        "--linear-attn-backend",
        STR,
        "triton",
        "Kernels for linear attention.",
        support=NOT_APPLICABLE,
        choices=LINEAR_ATTN_BACKEND_CHOICES,
    ),
    value(
        "--linear-attn-decode-backend",
        STR,
        None,
        "Linear attention kernels for decode.",
        support=NOT_APPLICABLE,
        choices=LINEAR_ATTN_BACKEND_CHOICES,
    ),
    value(
        "--linear-attn-prefill-backend",
        STR,
        None,
        "Linear attention kernels for prefill.",
        support=NOT_APPLICABLE,
        choices=LINEAR_ATTN_BACKEND_CHOICES,
    ),
    value(
        "--linear-attn-verify-backend",
        STR,
        None,
        "Linear attention kernels for speculative verify.",
        support=NOT_APPLICABLE,
        choices=LINEAR_ATTN_VERIFY_BACKEND_CHOICES,
    ),
    flag("--enable-linear-replayssm", "ReplaySSM buffered linear attention decode."),
    value("--linear-replayssm-cache-len", INT, 16, "Ring buffer length of ReplaySSM."),
    flag("--enable-linear-replayssm-spec", "ReplaySSM linear attention speculative verify."),
)
