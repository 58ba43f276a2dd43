"""Shares of this machine's ceilings for a benchmark run against a server on this machine.

The client sees only throughputs, so this is an estimate: compute from 2 x params per token over
all tokens, memory bandwidth from the decode steps the output rate implies when the running
batch is the measured concurrency (each step streams the weights once and reads each running
request's KV).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from radixserve.benchmarking.hardware import HardwareInfo, ceiling_shares, detect_hardware
from radixserve.benchmarking.model_cost import ModelCost

logger = logging.getLogger(__name__)


def _dtype(name: Any, default: torch.dtype) -> torch.dtype:
    value = getattr(torch, str(name), None) if name else None
    return value if isinstance(value, torch.dtype) else default


def estimate_serving_shares(
    result: Mapping[str, Any], model_path: str, server_info: Mapping[str, Any]
) -> tuple[HardwareInfo, dict[str, float]] | None:
    """(hardware, {"compute_share", "bandwidth_share"}) for a finished serving benchmark, or
    None when the model's config cannot be read here."""
    from radixserve.models.config import ModelConfig

    try:
        config = ModelConfig.from_pretrained(model_path)
    except (OSError, ValueError) as exc:
        logger.info("No ceiling shares: cannot read the model config (%s)", exc)
        return None
    weight_dtype = _dtype(server_info.get("resolved_dtype"), torch.float32)
    kv_dtype = _dtype(server_info.get("resolved_kv_cache_dtype"), weight_dtype)
    cost = ModelCost.from_config(config, weight_dtype, kv_dtype)
    hardware = detect_hardware(str(server_info.get("device") or "cpu"))
    completed = max(int(result["completed"]), 1)
    batch = max(float(result["concurrency"]), 1.0)
    mean_in = result["total_input_tokens"] / completed
    mean_out = result["total_output_tokens"] / completed
    # A decode step of `batch` requests reads the weights once (MoE: the experts they chose).
    step_weights = cost.weights_read(max(round(batch), 1))
    bytes_per_output_token = step_weights / batch + cost.kv_bytes_per_token * (
        mean_in + mean_out / 2
    )
    compute = ceiling_shares(
        result["total_throughput"], 0.0, cost.flops_per_token, hardware, cost.dtype
    )
    memory = ceiling_shares(
        result["output_throughput"], bytes_per_output_token, 0.0, hardware, cost.dtype
    )
    return hardware, {
        "compute_share": compute.compute_share,
        "bandwidth_share": memory.bandwidth_share,
    }
