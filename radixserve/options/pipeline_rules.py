"""Pipeline-parallel rules (--pp-size, --pp-max-micro-batch-size): what a pipeline runs with,
and what it does not run with yet (each refused with the option that conflicts)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from radixserve.options.errors import ServerArgsError

# (dest, option, why): settings that have no pipeline-parallel implementation here.
_NOT_WITH_PIPELINE = (
    ("speculative_algorithm", "--speculative-algorithm", "the draft and verify steps"),
    ("enable_lora", "--enable-lora", "the LoRA hooks"),
    ("lora_paths", "--lora-paths", "the LoRA hooks"),
    ("enable_hierarchical_cache", "--enable-hierarchical-cache", "host KV tier transfers"),
)


def check_pipeline(v: Mapping[str, Any]) -> None:
    pp = v.get("pp_size", 1)
    micro = v.get("pp_max_micro_batch_size")
    if micro is not None:
        if micro < 1:
            raise ServerArgsError("--pp-max-micro-batch-size", f"must be >= 1, got {micro}")
        if pp == 1:
            raise ServerArgsError(
                "--pp-max-micro-batch-size",
                "splits batches between pipeline stages: it needs --pp-size > 1",
            )
    if pp == 1:
        return
    if v.get("dp_size", 1) > 1:
        raise ServerArgsError(
            "--pp-size",
            f"{pp} cannot be combined with --dp-size {v['dp_size']} yet (replicas of a pipeline "
            "are not supported); use one of them",
        )
    for dest, option, what in _NOT_WITH_PIPELINE:
        if v.get(dest):
            raise ServerArgsError(
                "--pp-size",
                f"{pp} cannot be combined with {option} yet ({what} are not pipelined); "
                "use --pp-size 1, or leave out that option",
            )
    if v.get("quantization") in ("gguf", "w8a8_int8", "bitsandbytes"):
        raise ServerArgsError(
            "--pp-size",
            f"{pp} cannot be combined with --quantization {v['quantization']} yet; use "
            "--pp-size 1, or leave out --quantization",
        )
