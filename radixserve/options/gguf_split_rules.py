"""--quantization gguf with --tp-size > 1, checked on the file's tensor table before any
process starts: every row-split tensor (attention output, MLP and expert down projections)
must leave each rank whole blocks of its input dimension (models/gguf_shard.py cuts them).
The loader would find the same problem, but only after the ranks started and read weights."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from radixserve.options.errors import ServerArgsError

# GGUF tensor roles whose input dimension is split over the ranks that split it.
_ROW_SPLIT = ("attn_output", "ffn_down", "ffn_down_shexp")
_EXPERT_ROW_SPLIT = ("ffn_down_exps",)


def check_gguf_split(v: Mapping[str, Any]) -> None:
    """Raise ServerArgsError naming a tensor whose blocks a rank's slice would cut."""
    tp, ep = v.get("tp_size", 1) or 1, v.get("ep_size", 1) or 1
    path = Path(str(v.get("model_path", "")))
    if v.get("quantization") != "gguf" or tp == 1 or path.suffix.lower() != ".gguf":
        return
    if not path.is_file():
        return  # the loader reports a missing file
    from radixserve.kernels.gguf_types import FORMATS, QUANTIZED_TYPES, whole_blocks
    from radixserve.utils.gguf_cache import tensor_table

    try:
        table = tensor_table(path)
    except (OSError, ValueError):
        return  # the loader reports an unreadable file with its reason
    for tensor in table:
        role = _role(tensor.name)
        ranks = tp if role in _ROW_SPLIT else tp // ep if role in _EXPERT_ROW_SPLIT else 1
        if ranks == 1 or tensor.tensor_type not in QUANTIZED_TYPES:
            continue
        fmt = FORMATS[tensor.tensor_type]
        k = tensor.shape[0]  # GGUF order: the input dimension first
        # Rank r's columns start at r * (k // ranks): whole blocks when the width is.
        if k % ranks or not whole_blocks(tensor.tensor_type, 0, k // ranks):
            raise ServerArgsError(
                "--tp-size",
                f"{tp} splits {tensor.name}'s {k} input columns into {k // ranks}, which cuts "
                f"its {fmt.name} blocks ({fmt.weights} weights each); use a --tp-size that "
                f"leaves each rank a multiple of {fmt.weights}, or --quantization unquant",
            )


def _role(name: str) -> str:
    """blk.N.ROLE.weight (or blk.N.ROLE.E.weight, one tensor per expert) -> ROLE."""
    parts = name.split(".")
    return parts[2] if len(parts) >= 4 and parts[0] == "blk" else ""
