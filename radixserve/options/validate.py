"""Cross-option rules and support-level checks on resolved values; each failure names its option."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Mapping
from typing import Any, NamedTuple

from radixserve.options import hardware
from radixserve.options.compile_rules import check_torch_compile
from radixserve.options.deterministic_rules import check_deterministic
from radixserve.options.disaggregation_rules import check_disaggregation
from radixserve.options.errors import ServerArgsError
from radixserve.options.gguf_split_rules import check_gguf_split
from radixserve.options.hicache_rules import check_hicache
from radixserve.options.moe_rules import check_moe
from radixserve.options.node_rules import check_nodes
from radixserve.options.pipeline_rules import check_pipeline
from radixserve.options.ray_rules import check_ray
from radixserve.options.registry import dest_table
from radixserve.options.spec import Support
from radixserve.options.speculative_rules import check_speculative

logger = logging.getLogger(__name__)

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
SUPPORTED_DEVICES = ("cpu", "cuda")

# Counts, sizes and intervals for which zero or less means nothing.
_POSITIVE = (
    "page_size",
    "max_running_requests",
    "max_queued_requests",
    "max_total_tokens",
    "max_prefill_tokens",
    "context_length",
    "stream_interval",
    "num_continuous_decode_steps",
    "torch_compile_max_bs",
    "decode_log_interval",
    "watchdog_timeout",
    "max_payload_size",
)
_PARALLEL = {"tp_size": "tensor", "dp_size": "data", "pp_size": "pipeline"}
_NOT_YET_PARALLEL: tuple[str, ...] = ()


def _option(dest: str) -> str:
    return dest_table()[dest].spec.name


def _fail(dest: str, message: str) -> ServerArgsError:
    return ServerArgsError(_option(dest), message)


def _check_numbers(v: Mapping[str, Any]) -> None:
    for dest in _POSITIVE:
        if v.get(dest) is not None and v[dest] <= 0:
            raise _fail(dest, f"must be > 0, got {v[dest]}")
    chunk = v.get("chunked_prefill_size")
    if chunk is not None and chunk != -1 and chunk <= 0:
        raise _fail("chunked_prefill_size", f"must be -1 (disabled) or > 0, got {chunk}")
    fraction = v.get("mem_fraction_static")
    if fraction is not None and not 0 < fraction < 1:
        raise _fail("mem_fraction_static", f"must be between 0 and 1 (exclusive), got {fraction}")
    if v.get("schedule_conservativeness", 0) < 0:
        raise _fail("schedule_conservativeness", "must be >= 0")
    port = v.get("port")
    if port is not None and not 1 <= port <= 65535:
        raise _fail("port", f"must be between 1 and 65535, got {port}")
    gc = v.get("gc_threshold")
    if gc is not None and not 1 <= len(gc) <= 3:
        raise _fail("gc_threshold", f"takes 1 to 3 integers, got {len(gc)}")


def _check_parallel(v: Mapping[str, Any]) -> None:
    for dest, kind in _PARALLEL.items():
        size = v.get(dest, 1)
        if size < 1:
            raise _fail(dest, f"must be >= 1, got {size}")
        if size > 1 and dest in _NOT_YET_PARALLEL:
            raise _fail(dest, f"{kind} parallelism is not supported yet (got {size}); use 1")
    tp = v.get("tp_size", 1)
    if tp > 1 and v.get("quantization") in ("w8a8_int8", "bitsandbytes"):
        # Their blocks are made while loading, one rank's worth not yet (GGUF files' blocks
        # are cut per rank: models/gguf_shard.py).
        raise _fail(
            "tp_size",
            f"{tp} cannot be combined with --quantization {v['quantization']} (its blocks are "
            "not sharded); use --tp-size 1, or leave out --quantization",
        )
    ep = v.get("ep_size", 1)
    if ep < 1 or tp % ep:
        # SGLang's layout: ep groups of tp / ep ranks, each group holding whole experts.
        raise _fail("ep_size", f"{ep} must divide --tp-size {tp}; use a divisor of {tp}")
    check_nodes(v)
    check_pipeline(v)
    timeout = v.get("dist_timeout")
    if timeout is not None and timeout <= 0:
        raise _fail("dist_timeout", f"must be > 0 seconds, got {timeout}")
    addr = v.get("dist_init_addr")
    if addr:
        host, sep, port = str(addr).rpartition(":")
        if not sep or not host or not port.isdigit():
            raise _fail("dist_init_addr", f"expected HOST:PORT, got {addr!r}")


def _check_device(v: Mapping[str, Any]) -> None:
    device = v.get("device")
    if device not in SUPPORTED_DEVICES:
        raise _fail("device", f"{device!r} is not supported (supported: cpu, cuda)")
    if device == "cuda" and not hardware.cuda_available():
        raise _fail("device", "cuda was requested but no CUDA device is available")


def _check_misc(v: Mapping[str, Any]) -> None:
    for dest in ("log_level", "log_level_http"):
        level = v.get(dest)
        if level is not None and str(level).lower() not in LOG_LEVELS:
            raise _fail(dest, f"unknown level {level!r} (choose from {', '.join(LOG_LEVELS)})")
    if bool(v.get("ssl_keyfile")) != bool(v.get("ssl_certfile")):
        missing = "ssl_certfile" if v.get("ssl_keyfile") else "ssl_keyfile"
        raise _fail(missing, "--ssl-keyfile and --ssl-certfile must be given together")
    overrides = v.get("json_model_override_args")
    if overrides:
        try:
            parsed = json.loads(overrides)
        except json.JSONDecodeError as exc:
            raise _fail("json_model_override_args", f"invalid JSON: {exc.msg}") from None
        if not isinstance(parsed, dict):
            raise _fail("json_model_override_args", "must be a JSON object")


def validate(values: Mapping[str, Any]) -> None:
    """Raise ServerArgsError for the first rule ``values`` (resolved) breaks."""
    _check_numbers(values)
    _check_parallel(values)
    _check_device(values)
    _check_misc(values)
    check_hicache(values)
    check_speculative(values)
    check_torch_compile(values)
    check_deterministic(values)
    check_ray(values)
    check_disaggregation(values)
    check_moe(values)
    check_gguf_split(values)


def valid_tp_sizes(num_attention_heads: int, num_kv_heads: int) -> list[int]:
    """The --tp-size values that split a model's heads: each rank gets whole query heads, and
    KV heads are either split or each replicated on tp / kv ranks."""
    return [
        tp
        for tp in range(1, num_attention_heads + 1)
        if num_attention_heads % tp == 0 and (num_kv_heads % tp == 0 or tp % num_kv_heads == 0)
    ]


def validate_against_model(tp_size: int, num_attention_heads: int, num_kv_heads: int) -> None:
    """The rules that need the model config: tensor parallelism must split the heads evenly."""
    if tp_size in valid_tp_sizes(num_attention_heads, num_kv_heads):
        return
    choices = ", ".join(map(str, valid_tp_sizes(num_attention_heads, num_kv_heads)))
    if num_attention_heads % tp_size:
        why = f"does not divide the model's {num_attention_heads} attention heads"
    else:
        why = f"neither divides nor is a multiple of the model's {num_kv_heads} KV heads"
    raise ServerArgsError("--tp-size", f"{tp_size} {why}; use one of {choices}")


class SupportReport(NamedTuple):
    """Options set away from their default, by support level; each entry reads ``--x=value``."""

    not_applicable: tuple[str, ...]
    unsupported: tuple[str, ...]
    unsupported_choices: tuple[str, ...]


def _differs(value: Any, reference: Any) -> bool:
    if isinstance(value, (list, tuple)) and isinstance(reference, (list, tuple)):
        return tuple(value) != tuple(reference)
    return value != reference


def support_report(
    values: Mapping[str, Any], auto: Mapping[str, Any] | None = None
) -> SupportReport:
    """Which set options are ignored here, which are refused. ``auto`` holds values that
    resolution itself chose, which do not count as set by the user."""
    auto = auto or {}
    ignored: list[str] = []
    refused: list[str] = []
    bad_choice: list[str] = []
    for dest, info in dest_table().items():
        value = values.get(dest, info.default)
        if not _differs(value, info.default) or (dest in auto and not _differs(value, auto[dest])):
            continue
        shown = f"{info.spec.name}={value}"
        if info.support is Support.NOT_APPLICABLE:
            ignored.append(shown)
        elif info.support is Support.UNSUPPORTED:
            refused.append(shown)
        elif info.spec.supported_choices is not None and not _choice_supported(
            value, info.spec.supported_choices
        ):
            supported = ", ".join(map(str, info.spec.supported_choices))
            bad_choice.append(f"{info.spec.name} {value} (supported: {supported})")
    return SupportReport(tuple(ignored), tuple(refused), tuple(bad_choice))


def _choice_supported(value: Any, supported: tuple[Any, ...]) -> bool:
    """A list value (an nargs option) is supported when each of its items is."""
    if isinstance(value, list | tuple):
        return all(item in supported for item in value)
    return value in supported


def check_supported(report: SupportReport) -> None:
    """Refuse options radixserve does not implement, rather than silently ignoring them."""
    if report.unsupported:
        first = report.unsupported[0].split("=", 1)[0]
        listed = ", ".join(report.unsupported)
        raise ServerArgsError(
            first, f"not supported by radixserve yet: {listed} (leave at the default)"
        )
    if report.unsupported_choices:
        first = report.unsupported_choices[0].split(" ", 1)[0]
        listed = "; ".join(report.unsupported_choices)
        raise ServerArgsError(first, f"value not supported by radixserve: {listed}")


def check_port_available(host: str, port: int) -> None:
    """Raise ServerArgsError when ``host:port`` cannot be bound (call it right before serving)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ServerArgsError(
                "--port", f"cannot listen on {host}:{port}: {exc.strerror}"
            ) from None
