"""Options: SGLang's deprecated spellings, kept working the way SGLang keeps them.

Each one warns once when used and stores into the option that replaced it, so
``--cuda-graph-max-bs 8`` sets ``cuda_graph_max_bs_decode`` exactly like upstream. Registering
the old spellings explicitly is also what keeps them unambiguous under argparse's prefix
matching: ``--cuda-graph-max-bs`` is a prefix of both ``--cuda-graph-max-bs-decode`` and
``--cuda-graph-max-bs-prefill``.
"""

from __future__ import annotations

from radixserve.options.choices import DSA_BACKEND_CHOICES
from radixserve.options.spec import (
    OptionSpec,
    deprecated_alias,
    deprecated_const,
    deprecated_noop,
)
from radixserve.options.value_types import INT

AREA = "Deprecated spellings"

# SGLang renamed the prefill context-parallel modes; the old names map onto --cp-strategy.
_CP_MODES = {"in-seq-split": "zigzag", "round-robin-split": "interleave"}

OPTIONS: tuple[OptionSpec, ...] = (
    deprecated_alias(
        "--cuda-graph-max-bs", "--cuda-graph-max-bs-decode", "cuda_graph_max_bs_decode", INT
    ),
    deprecated_alias(
        "--cuda-graph-bs", "--cuda-graph-bs-decode", "cuda_graph_bs_decode", INT, nargs="+"
    ),
    deprecated_alias(
        "--piecewise-cuda-graph-tokens",
        "--cuda-graph-bs-prefill",
        "cuda_graph_bs_prefill",
        INT,
        nargs="+",
    ),
    deprecated_alias(
        "--piecewise-cuda-graph-max-tokens",
        "--cuda-graph-max-bs-prefill",
        "cuda_graph_max_bs_prefill",
        INT,
    ),
    deprecated_alias(
        "--piecewise-cuda-graph-compiler",
        "--cuda-graph-tc-compiler",
        "cuda_graph_tc_compiler",
        choices=("eager", "inductor"),
    ),
    deprecated_const(
        "--disable-cuda-graph",
        "--cuda-graph-backend-{decode,prefill}=disabled",
        "disable_cuda_graph",
    ),
    deprecated_const(
        "--enable-breakable-cuda-graph",
        "--cuda-graph-backend-prefill=breakable",
        "cuda_graph_backend_prefill",
        "breakable",
    ),
    deprecated_const(
        "--disable-piecewise-cuda-graph",
        "--cuda-graph-backend-prefill=disabled",
        "cuda_graph_backend_prefill",
        "disabled",
    ),
    deprecated_const(
        "--enforce-piecewise-cuda-graph",
        "--cuda-graph-backend-prefill=tc_piecewise",
        "cuda_graph_backend_prefill",
        "tc_piecewise",
    ),
    deprecated_const(
        "--enable-flashinfer-allreduce-fusion",
        "--flashinfer-allreduce-fusion-backend=auto",
        "flashinfer_allreduce_fusion_backend",
        "auto",
    ),
    deprecated_const(
        "--stream-output", "--incremental-streaming-output", "incremental_streaming_output"
    ),
    deprecated_noop("--prefill-round-robin-balance", "it has no effect any more."),
    deprecated_noop(
        "--collect-tokens-histogram", "token histograms are collected with --enable-metrics."
    ),
    deprecated_alias(
        "--nsa-prefill-backend",
        "--dsa-prefill-backend",
        "dsa_prefill_backend",
        choices=DSA_BACKEND_CHOICES,
    ),
    deprecated_alias(
        "--nsa-decode-backend",
        "--dsa-decode-backend",
        "dsa_decode_backend",
        choices=DSA_BACKEND_CHOICES,
    ),
    deprecated_alias(
        "--speculative-dflash-draft-window-size",
        "--speculative-draft-window-size",
        "speculative_draft_window_size",
        INT,
        hidden=True,
    ),
    deprecated_alias(
        "--mamba-scheduler-strategy", "--mamba-radix-cache-strategy", "mamba_radix_cache_strategy"
    ),
    deprecated_const(
        "--enable-dsa-prefill-context-parallel", "--enable-prefill-cp", "enable_prefill_cp"
    ),
    deprecated_const(
        "--enable-nsa-prefill-context-parallel", "--enable-prefill-cp", "enable_prefill_cp"
    ),
    deprecated_const(
        "--enable-prefill-context-parallel", "--enable-prefill-cp", "enable_prefill_cp"
    ),
    deprecated_alias(
        "--dsa-prefill-cp-mode",
        "--cp-strategy",
        "cp_strategy",
        choices=tuple(_CP_MODES),
        value_map=_CP_MODES,
    ),
    deprecated_alias(
        "--nsa-prefill-cp-mode",
        "--cp-strategy",
        "cp_strategy",
        choices=tuple(_CP_MODES),
        value_map=_CP_MODES,
    ),
    deprecated_alias(
        "--prefill-cp-mode",
        "--cp-strategy",
        "cp_strategy",
        choices=("in-seq-split",),
        value_map=_CP_MODES,
    ),
)
