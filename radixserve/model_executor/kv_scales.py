"""Per-layer K/V scales of an 8-bit KV cache (--kv-cache-dtype fp8_e4m3 / fp8_e5m2).

An 8-bit cache stores K / k_scale and V / v_scale (kernels/kv_codes.py). The scales come, as
in SGLang, from:
1. --quantization-param-path: a JSON file in the format SGLang and vLLM read,
   {"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"<tp rank>": {"<layer>": s}}}},
   one scale per layer for both K and V;
2. else the checkpoint, where it has them (FP8 checkpoints name them
   `model.layers.<i>.self_attn.k_scale` / `v_scale`, some `...self_attn.attn.k_scale`, older
   ones one `kv_scale`, or `k_proj.output_scale` / `v_proj.output_scale`);
3. else 1.0 for every layer, with a warning (values beyond the format's range saturate).
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

# The checkpoint tensor names that hold a layer's KV scales -> which of K and V they scale.
_SCALE_NAMES = (
    (re.compile(r"layers\.(\d+)\.self_attn\.(?:attn\.)?k_scale$"), "k"),
    (re.compile(r"layers\.(\d+)\.self_attn\.(?:attn\.)?v_scale$"), "v"),
    (re.compile(r"layers\.(\d+)\.self_attn\.(?:attn\.)?kv_scale$"), "kv"),
    (re.compile(r"layers\.(\d+)\.self_attn\.k_proj\.output_scale$"), "k"),
    (re.compile(r"layers\.(\d+)\.self_attn\.v_proj\.output_scale$"), "v"),
)


@dataclass(frozen=True)
class KvScales:
    k: list[float]
    v: list[float]
    source: str  # for the startup log


def ones(num_layers: int) -> KvScales:
    return KvScales([1.0] * num_layers, [1.0] * num_layers, "none (1.0 for every layer)")


def load_kv_scales(
    *,
    kv_dtype: torch.dtype,
    num_layers: int,
    tp_rank: int,
    tp_size: int,
    param_path: str | None,
    model_dir: Path | None,
) -> KvScales:
    """The scales of an 8-bit cache of `kv_dtype`, from the first source that has them."""
    if param_path is not None:
        scales = scales_from_json(Path(param_path), kv_dtype, num_layers, tp_rank, tp_size)
        return KvScales(scales, list(scales), f"--quantization-param-path {param_path}")
    found = scales_from_checkpoint(model_dir, num_layers) if model_dir is not None else None
    if found is not None:
        return found
    logger.warning(
        "Using an FP8 KV cache without scaling factors (no --quantization-param-path, none in "
        "the checkpoint): every layer's K and V scale is 1.0, which may be less accurate"
    )
    return ones(num_layers)


def scales_from_json(
    path: Path, kv_dtype: torch.dtype, num_layers: int, tp_rank: int, tp_size: int
) -> list[float]:
    """This tensor-parallel rank's per-layer scales from an SGLang/vLLM KV scales JSON."""
    where = f"--quantization-param-path {path}"
    try:
        data = json.loads(path.read_text())
        kv = data["kv_cache"]
        table = kv["scaling_factor"]
    except (OSError, ValueError) as e:
        raise ValueError(f"{where}: cannot read it as JSON ({e})") from e
    except (KeyError, TypeError):
        raise ValueError(f"{where}: no kv_cache.scaling_factor table") from None
    dtype = kv.get("dtype")
    expected = str(kv_dtype).removeprefix("torch.")
    if dtype is not None and dtype != expected:
        raise ValueError(f"{where}: its scales are for {dtype}, the KV cache is {expected}")
    if not isinstance(table, dict) or len(table) != tp_size:
        ranks = len(table) if isinstance(table, dict) else 0
        raise ValueError(f"{where}: scales for {ranks} tensor-parallel ranks, running {tp_size}")
    rank = table.get(str(tp_rank))
    if not isinstance(rank, dict):
        raise ValueError(f"{where}: no scales for tensor-parallel rank {tp_rank}")
    try:
        by_layer = {int(layer): float(value) for layer, value in rank.items()}
    except (TypeError, ValueError):
        raise ValueError(f"{where}: layer ids and scales must be numbers") from None
    if sorted(by_layer) != list(range(num_layers)):
        raise ValueError(f"{where}: needs one scale for each of the model's {num_layers} layers")
    scales = [by_layer[i] for i in range(num_layers)]
    _check_positive(scales, where)
    return scales


def scales_from_checkpoint(model_dir: Path, num_layers: int) -> KvScales | None:
    """K and V scales from a safetensors checkpoint's scale tensors, or None where it has
    none. A scale with several values (per head) becomes its largest: the one per layer the
    kernels take must not make any head's values overflow."""
    from radixserve.models.weight_utils import read_named_tensors

    found: dict[str, dict[int, float]] = {"k": {}, "v": {}}

    def wanted(name: str) -> bool:
        return any(pattern.search(name) for pattern, _ in _SCALE_NAMES)

    for name, tensor in read_named_tensors(model_dir, wanted):
        for pattern, which in _SCALE_NAMES:
            match = pattern.search(name)
            if match is None:
                continue
            value = float(tensor.float().abs().max())
            for part in which:  # "kv": one scale for both
                found[part][int(match.group(1))] = value
    if not found["k"] and not found["v"]:
        return None
    where = f"the checkpoint's KV scales ({model_dir})"
    layers = list(range(num_layers))
    if sorted(found["k"]) != layers or sorted(found["v"]) != layers:
        raise ValueError(f"{where}: needs a K and a V scale for each of the {num_layers} layers")
    k = [found["k"][i] for i in layers]
    v = [found["v"][i] for i in layers]
    _check_positive(k + v, where)
    return KvScales(k, v, "the checkpoint")


def _check_positive(scales: list[float], where: str) -> None:
    bad = [s for s in scales if not (math.isfinite(s) and s > 0)]
    if bad:
        raise ValueError(f"{where}: scales must be positive and finite, got {bad[0]}")
