"""How many tokens the KV pool holds.

SGLang fills a fraction of device memory (--mem-fraction-static) with KV cache. On a CPU server
that reads as alarming (half of the host's RAM for a 135M model) and buys nothing: a CPU serves
a few dozen requests at a time. So when neither --max-total-tokens nor --mem-fraction-static is
given, the CPU pool is capped at CPU_KV_CAP_CONTEXTS full contexts (at least CPU_KV_CAP_MIN
tokens). The pool is allocated uninitialised either way, so the OS commits its pages only as
they are used.

The default fraction on a CPU (half the RAM for weights and KV) would refuse a model whose
weights alone take more than that though it fits the machine (a 30B-A3B MoE in Q4_K_M is 17 GiB
on a 24 GiB host). So when nothing was asked for, a CPU pool may also use what
CPU_LARGE_MODEL_FRACTION of the RAM leaves after the weights, whichever is more.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

logger = logging.getLogger(__name__)

CPU_KV_CAP_CONTEXTS = 4
CPU_KV_CAP_MIN = 65_536
CPU_LARGE_MODEL_FRACTION = 0.9


class KvPoolSize(NamedTuple):
    tokens: int
    reason: str  # for the startup log: where the number came from


def plan_kv_pool(
    *,
    device: str,
    memory_bytes: int,
    mem_fraction_static: float,
    weight_bytes: int,
    bytes_per_token: int,
    context_len: int,
    page_size: int,
    max_total_tokens: int | None,
    sized_by_default: bool,
) -> KvPoolSize:
    """The pool size in tokens (a multiple of page_size); ValueError when too small to serve."""
    budget = int(memory_bytes * mem_fraction_static) - weight_bytes
    from_memory = max(budget // bytes_per_token, 0)
    if max_total_tokens is not None:
        if max_total_tokens > from_memory:
            logger.warning(
                "--max-total-tokens %d exceeds what --mem-fraction-static leaves (%d); using it "
                "anyway",
                max_total_tokens,
                from_memory,
            )
        tokens, reason = max_total_tokens, "--max-total-tokens"
    else:
        tokens = from_memory
        reason = f"--mem-fraction-static {mem_fraction_static} of {memory_bytes / 2**30:.1f} GiB"
        if device == "cpu" and sized_by_default:
            large = int(memory_bytes * CPU_LARGE_MODEL_FRACTION) - weight_bytes
            if large // bytes_per_token > tokens:
                tokens = large // bytes_per_token
                reason = (
                    f"{CPU_LARGE_MODEL_FRACTION} of {memory_bytes / 2**30:.1f} GiB less the "
                    f"{weight_bytes / 2**30:.1f} GiB of weights (they exceed the default "
                    "--mem-fraction-static)"
                )
        cap = max(CPU_KV_CAP_CONTEXTS * context_len, CPU_KV_CAP_MIN)
        if device == "cpu" and sized_by_default and tokens > cap:
            tokens = cap
            reason = (
                f"capped on CPU at max({CPU_KV_CAP_CONTEXTS} x the {context_len}-token context, "
                f"{CPU_KV_CAP_MIN}); --max-total-tokens or --mem-fraction-static set it"
            )
    tokens = tokens // page_size * page_size
    if tokens < page_size * 2:
        raise ValueError(
            f"The KV cache would hold only {tokens} tokens: raise --mem-fraction-static or "
            "--max-total-tokens"
        )
    return KvPoolSize(tokens, reason)
