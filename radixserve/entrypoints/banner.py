"""The startup banner: the resolved settings that matter, in one block, and where to connect."""

from __future__ import annotations

from typing import Any


def startup_banner(server_args: Any, ready: Any, cpu_plan: Any, url: str) -> str:
    """Lines for the log once the engine is up (ready: SchedulerReady; cpu_plan: CpuPlan or
    None when the model runs in this process)."""
    kv_dtype = getattr(server_args, "resolved_kv_cache_dtype", "") or server_args.kv_cache_dtype
    quant = getattr(server_args, "quantization", None) or "none"
    dp = int(getattr(server_args, "dp_size", 1) or 1)
    per_replica = f" per replica x {dp} replicas" if dp > 1 else ""
    rows = [
        ("model", f"{server_args.served_model_name} ({', '.join(ready.architectures)})"),
        ("weights", f"{server_args.resolved_dtype} on {server_args.device}, quantization {quant}"),
        ("attention", _attention(server_args.attention_backend, ready)),
        ("threads", cpu_plan.describe() if cpu_plan is not None else "in-process"),
        ("KV cache", f"{ready.max_total_tokens:,} tokens{per_replica} ({kv_dtype})"),
        ("context", f"{ready.context_len:,} tokens"),
        (
            "batching",
            f"max {ready.max_running_requests} running requests, "
            f"prefill chunks of {server_args.chunked_prefill_size} tokens",
        ),
        ("grammar", server_args.grammar_backend),
        ("OpenAI API", f"{url}/v1"),
        ("docs", f"{url}/docs"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(["radixserve is ready"] + [f"  {n:<{width}}  {v}" for n, v in rows])


def _attention(backend: str, ready: Any) -> str:
    """The option's value (SGLang's name, intel_amx on any CPU) and what actually runs."""
    kernels = getattr(ready, "kernels", "")
    return f"{backend} ({kernels})" if kernels else backend
