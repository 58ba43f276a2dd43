"""Options: CUDA graph capture (radixserve captures no CUDA graphs; the decode batch-size
list also sets --enable-torch-compile's buckets on the CPU)."""

from __future__ import annotations

from radixserve.options.choices import CUDA_GRAPH_BACKEND_CHOICES
from radixserve.options.spec import IMPLEMENTED, NOT_APPLICABLE, OptionSpec, flag, value
from radixserve.options.value_types import INT, JSON_OBJECT, STR

AREA = "CUDA graphs"

OPTIONS: tuple[OptionSpec, ...] = (
    value(
        "--cuda-graph-config",
        JSON_OBJECT,
        None,
        "Per-phase CUDA graph settings as JSON.",
        support=NOT_APPLICABLE,
    ),
    value(
        "--cuda-graph-backend-decode",
        STR,
        None,
        "CUDA graph backend for decode.",
        support=NOT_APPLICABLE,
        choices=CUDA_GRAPH_BACKEND_CHOICES,
    ),
    value(
        "--cuda-graph-backend-prefill",
        STR,
        None,
        "CUDA graph backend for prefill.",
        support=NOT_APPLICABLE,
        choices=CUDA_GRAPH_BACKEND_CHOICES,
    ),
    value(
        "--cuda-graph-max-bs-decode",
        INT,
        None,
        "Largest decode batch captured in a CUDA graph.",
        support=NOT_APPLICABLE,
    ),
    value(
        "--cuda-graph-max-bs-prefill",
        INT,
        None,
        "Largest prefill batch (tokens) captured in a CUDA graph.",
        support=NOT_APPLICABLE,
    ),
    value(
        "--cuda-graph-bs-decode",
        INT,
        None,
        "Decode batch sizes to capture. radixserve (CPU): the batch sizes "
        "--enable-torch-compile compiles; a batch is padded to the next one.",
        support=IMPLEMENTED,
        nargs="+",
    ),
    value(
        "--cuda-graph-bs-prefill",
        INT,
        None,
        "Prefill batch sizes to capture.",
        support=NOT_APPLICABLE,
        nargs="+",
    ),
    value(
        "--cuda-graph-tc-compiler",
        STR,
        None,
        "Compiler of the tc_piecewise CUDA graph backend.",
        support=NOT_APPLICABLE,
        choices=("eager", "inductor"),
    ),
    flag("--disable-prefill-cuda-graph", "Disable the prefill CUDA graph.", support=NOT_APPLICABLE),
    flag("--disable-decode-cuda-graph", "Disable the decode CUDA graph.", support=NOT_APPLICABLE),
    flag(
        "--disable-cuda-graph-padding",
        "Skip CUDA graphs when a batch would need padding.",
        support=NOT_APPLICABLE,
    ),
    flag("--enable-profile-cuda-graph", "Profile CUDA graph capture.", support=NOT_APPLICABLE),
    flag(
        "--enable-cudagraph-gc",
        "Allow garbage collection during CUDA graph capture.",
        support=NOT_APPLICABLE,
    ),
    flag(
        "--debug-cuda-graph",
        "Run CUDA graph capture/replay eagerly for debugging.",
        support=NOT_APPLICABLE,
    ),
)
