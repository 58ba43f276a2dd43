"""ServerArgs: every server option, resolved for this device and frozen.

Build it with ``ServerArgs.from_cli(argv)`` (the ``radixserve serve`` command line) or
``ServerArgs.from_kwargs(**kwargs)`` (the Python ``Engine``); plain construction and
``dataclasses.replace`` go through the same checks. Options radixserve implements are typed
fields named like SGLang's dests; every other ``sglang serve`` option is kept in ``other`` and
is readable as an attribute too (``args.cuda_graph_max_bs_decode``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from radixserve.defaults import DEFAULT_HOST, DEFAULT_PORT
from radixserve.options import registry
from radixserve.options.coerce import coerce_value
from radixserve.options.command_line import parse_command_line
from radixserve.options.errors import OptionError, ServerArgsError
from radixserve.options.kwargs import kwargs_to_values
from radixserve.options.readonly import ReadOnlyMapping
from radixserve.options.resolve import resolve, resolve_dtype, resolve_kv_cache_dtype
from radixserve.options.validate import (
    check_port_available,
    check_supported,
    support_report,
    validate,
    validate_against_model,
)

logger = logging.getLogger(__name__)

__all__ = ["OptionError", "ServerArgs", "ServerArgsError", "check_port_available"]


@dataclass(frozen=True)
class ServerArgs:
    """The server configuration; immutable once built, with nothing left on "auto".

    Invariants after construction: ``model_path``, ``tokenizer_path``, ``served_model_name``,
    ``device`` ('cpu' or 'cuda'), ``random_seed``, ``page_size``, ``chunked_prefill_size``,
    ``mem_fraction_static`` and the backend names are concrete; ``resolved_dtype`` and
    ``resolved_kv_cache_dtype`` are torch dtype names; ``other`` holds every remaining
    ``sglang serve`` dest; every value passed the support and cross-option checks.
    """

    # Model and tokenizer
    model_path: str | None = None
    tokenizer_path: str | None = None
    tokenizer_mode: str = "auto"
    skip_tokenizer_init: bool = False
    load_format: str = "auto"
    trust_remote_code: bool = False
    context_length: int | None = None
    is_embedding: bool = False
    # Vision models (docs/vision.md): SGLang's switch (LLaVA takes images with or without it)
    # and the per-request image cap, {"image": N}.
    enable_multimodal: bool | None = None
    limit_mm_data_per_request: Any = None
    # http(s) image URLs (multimodal/media_fetch.py): the hosts allowed (empty: any) and the
    # byte cap of one download, in MiB.
    allowed_media_domains: tuple[str, ...] = ()
    media_url_max_file_size_mb: int = 64
    # The vision encoder's outputs kept by image hash, in MiB (None: models/
    # vision_feature_cache.py's default).
    mm_preprocess_cache_size_mb: int | None = None
    grammar_backend: str | None = None
    constrained_json_whitespace_pattern: str | None = None
    constrained_json_disable_any_whitespace: bool = False
    revision: str | None = None
    json_model_override_args: str = "{}"
    download_dir: str | None = None
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    quantization: str | None = None
    quantization_param_path: str | None = None
    # Memory and scheduling
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    max_queued_requests: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int = 16384
    schedule_policy: str = "fcfs"
    enable_priority_scheduling: bool = False
    default_priority_value: int | None = None
    disable_priority_preemption: bool = False
    abort_on_priority_when_disabled: bool = False
    priority_scheduling_preemption_threshold: int = 10
    schedule_low_priority_values_first: bool = False
    retraction_policy: str = "length"
    schedule_conservativeness: float = 1.0
    page_size: int | None = None
    radix_eviction_policy: str = "lru"
    disable_radix_cache: bool = False
    enable_hierarchical_cache: bool = False
    hicache_ratio: float = 2.0
    hicache_size: int = 0
    hicache_write_policy: str = "write_through"
    hicache_mem_layout: str = "page_first"
    hicache_storage_backend: str | None = None
    disable_overlap_schedule: bool = False
    enable_mixed_chunk: bool = False
    # Parallelism and device
    tp_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    pp_size: int = 1
    pp_max_micro_batch_size: int | None = None
    dp_size: int = 1
    # Mixture of experts (options/moe.py)
    ep_size: int = 1
    moe_a2a_backend: str = "none"
    moe_runner_backend: str = "auto"
    expert_distribution_recorder_mode: str | None = None
    ep_num_redundant_experts: int = 0
    init_expert_location: str = "trivial"
    enable_eplb: bool = False
    eplb_algorithm: str = "auto"
    eplb_rebalance_num_iterations: int = 1000
    eplb_rebalance_layers_per_chunk: int | None = None
    eplb_min_rebalancing_utilization_threshold: float = 1.0
    enable_return_routed_experts: bool = False
    load_balance_method: str = "auto"
    dist_init_addr: str | None = None
    dist_timeout: int | None = None
    nccl_port: int | None = None
    use_ray: bool = False
    # Prefill/decode disaggregation (managers/disagg_*.py, docs/scaling.md)
    disaggregation_mode: str = "null"
    disaggregation_transfer_backend: str = "mooncake"
    disaggregation_bootstrap_port: int = 8998
    disaggregation_ib_device: str | None = None
    device: str | None = None
    random_seed: int | None = None
    gc_threshold: tuple[int, ...] | None = None
    # HTTP server and API
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    fastapi_root_path: str = ""
    skip_server_warmup: bool = False
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    api_key: str | None = None
    admin_api_key: str | None = None
    max_payload_size: int | None = None
    disable_web_ui: bool = False
    served_model_name: str | None = None
    weight_version: str = "default"
    chat_template: str | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    enable_cache_report: bool = False
    preferred_sampling_params: dict[str, Any] | None = None
    stream_interval: int = 1
    stream_response_default_include_usage: bool = False
    # Logging and metrics
    log_level: str = "info"
    log_level_http: str | None = None
    log_requests: bool = False
    log_requests_level: int = 2
    uvicorn_access_log_exclude_prefixes: tuple[str, ...] = ()
    enable_metrics: bool = False
    decode_log_interval: int = 40
    enable_request_time_stats_logging: bool = False
    crash_dump_folder: str | None = None
    enable_custom_logit_processor: bool = False
    # Kernels and execution
    attention_backend: str | None = None
    decode_attention_backend: str | None = None
    prefill_attention_backend: str | None = None
    sampling_backend: str | None = None
    config: str | None = None
    # torch.compile of CPU decode steps (model_executor/compiled_decode.py)
    enable_torch_compile: bool = False
    enable_deterministic_inference: bool = False
    enable_torch_compile_debug_mode: bool = False
    torch_compile_max_bs: int = 32
    cuda_graph_bs_decode: tuple[int, ...] | None = None
    # LoRA adapters (radixserve/lora/config.py turns these into a LoRAConfig)
    enable_lora: bool | None = None
    max_lora_rank: int | None = None
    lora_target_modules: tuple[str, ...] | None = None
    lora_paths: tuple[str, ...] | None = None
    max_loaded_loras: int | None = None
    max_loras_per_batch: int = 8
    lora_eviction_policy: str = "lru"
    # Speculative decoding (radixserve/speculative/)
    speculative_algorithm: str | None = None
    speculative_draft_model_path: str | None = None
    speculative_num_steps: int | None = None
    speculative_num_draft_tokens: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_ngram_min_bfs_breadth: int = 1
    speculative_ngram_max_bfs_breadth: int = 10
    speculative_ngram_match_type: str = "BFS"
    speculative_ngram_max_trie_depth: int = 18
    speculative_ngram_capacity: int = 10000000
    speculative_adaptive: bool = False
    speculative_token_map: str | None = None
    # Every other `sglang serve` option, by dest.
    other: Mapping[str, Any] = field(default_factory=ReadOnlyMapping)
    # Derived during construction; not arguments.
    resolved_dtype: str = field(init=False, default="")
    resolved_kv_cache_dtype: str = field(init=False, default="")
    not_applicable: tuple[str, ...] = field(init=False, default=(), compare=False)
    # Neither --max-total-tokens nor --mem-fraction-static was given (the CPU pool is capped).
    kv_pool_sized_by_default: bool = field(init=False, default=False, compare=False)

    def __post_init__(self) -> None:
        values = self._collect_values()
        sized_by_default = (
            values.get("max_total_tokens") is None and values.get("mem_fraction_static") is None
        )
        resolution = resolve(values)
        resolved = resolution.values
        validate(resolved)
        report = support_report(resolved, resolution.auto)
        check_supported(report)
        for name in _FIELD_NAMES:
            object.__setattr__(self, name, resolved[name])
        other = {dest: resolved[dest] for dest in _OTHER_DESTS}
        object.__setattr__(self, "other", ReadOnlyMapping(other))
        dtype = resolve_dtype(self.dtype, resolved["device"])
        object.__setattr__(self, "resolved_dtype", dtype)
        object.__setattr__(
            self, "resolved_kv_cache_dtype", resolve_kv_cache_dtype(self.kv_cache_dtype, dtype)
        )
        object.__setattr__(self, "not_applicable", report.not_applicable)
        object.__setattr__(self, "kv_pool_sized_by_default", sized_by_default)

    def _collect_values(self) -> dict[str, Any]:
        other = dict(self.other)
        unknown = sorted(set(other) - set(_OTHER_DESTS))
        if unknown:
            raise TypeError(f"ServerArgs.other has unknown option(s): {', '.join(unknown)}")
        values = registry.defaults()
        values.update(other)
        values.update({name: getattr(self, name) for name in _FIELD_NAMES})
        return {dest: coerce_value(dest, value) for dest, value in values.items()}

    def __repr__(self) -> str:
        # The ~400 options in `other` are nearly all at their defaults; show the ones that
        # are not, so a logged ServerArgs stays readable.
        table = registry.dest_table()
        own = ", ".join(f"{name}={getattr(self, name)!r}" for name in _FIELD_NAMES)
        changed = {k: v for k, v in self.other.items() if v != table[k].default}
        return f"ServerArgs({own}, other={changed!r})"

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: options without a field live in `other`.
        if not name.startswith("_"):
            other = self.__dict__.get("other")
            if other is not None and name in other:
                return other[name]
        raise AttributeError(f"'ServerArgs' object has no attribute {name!r}")

    @classmethod
    def from_cli(cls, argv: Sequence[str]) -> ServerArgs:
        """Parse a ``radixserve serve`` command line (without the program and ``serve``).

        Raises OptionError for a bad command line or config file, ServerArgsError for values
        that cannot be used, SystemExit(0) after printing ``--help``.
        """
        return cls._from_values(parse_command_line(argv))

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> ServerArgs:
        """Build from SGLang dests as keywords; an unknown keyword raises TypeError.

        ``config="file.yaml"`` reads that file first; the keywords override it.
        """
        values = kwargs_to_values(kwargs)
        if values.get("config"):
            values = {**parse_command_line(["--config", values["config"]]), **values}
        return cls._from_values(values)

    @classmethod
    def _from_values(cls, values: Mapping[str, Any]) -> ServerArgs:
        own = {dest: value for dest, value in values.items() if dest in _FIELD_NAMES}
        other = {dest: value for dest, value in values.items() if dest not in _FIELD_NAMES}
        return cls(**own, other=other)

    def to_dict(self) -> dict[str, Any]:
        """Every option by dest, like SGLang's ``dataclasses.asdict(server_args)``."""
        result = {name: getattr(self, name) for name in _FIELD_NAMES}
        result.update(self.other)
        result["resolved_dtype"] = self.resolved_dtype
        result["resolved_kv_cache_dtype"] = self.resolved_kv_cache_dtype
        return result

    @property
    def torch_dtype(self) -> Any:
        """``resolved_dtype`` as a torch.dtype (imports torch)."""
        import torch

        return getattr(torch, self.resolved_dtype)

    def url(self) -> str:
        """Where a local client reaches the HTTP server."""
        host = {"0.0.0.0": DEFAULT_HOST, "::": "::1", "": DEFAULT_HOST}.get(self.host, self.host)
        if ":" in host:
            host = f"[{host}]"
        scheme = "https" if self.ssl_certfile else "http"
        return f"{scheme}://{host}:{self.port}"

    def validate_against_model(self, num_attention_heads: int, num_kv_heads: int) -> None:
        """Checks that need the model config (call once it is loaded)."""
        validate_against_model(self.tp_size, num_attention_heads, num_kv_heads)

    def warn_not_applicable(self) -> None:
        """Log the one startup warning about set options that have no effect here."""
        if self.not_applicable:
            logger.warning(
                "Ignoring options that have no effect in radixserve on this hardware: %s",
                ", ".join(self.not_applicable),
            )

    def check_port_available(self) -> None:
        """Raise ServerArgsError when the HTTP port cannot be bound."""
        check_port_available(self.host, self.port)


_FIELD_NAMES: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(ServerArgs) if f.init and f.name != "other"
)
_OTHER_DESTS: tuple[str, ...] = tuple(
    dest for dest in registry.dest_table() if dest not in _FIELD_NAMES
)
