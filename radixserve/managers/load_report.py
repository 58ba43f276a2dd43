"""The scheduler's load as SGLang reports it on /get_load, which sglang-router polls to balance
workers (its power_of_two policy, and the load column of its /get_loads)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixserve.managers.scheduler import Scheduler


def load_fields(scheduler: Scheduler) -> dict[str, Any]:
    """Tokens the scheduler is committed to: KV held by requests (what is neither free nor
    evictable cache) plus the prompts still waiting, and the requests behind them."""
    kv = scheduler.kv
    held = kv.allocator.size - kv.available_tokens()
    waiting_prompt = sum(len(req.origin_input_ids) for req in scheduler.waiting)
    running = len(scheduler.running) + int(scheduler.chunked_req is not None)
    return {
        "num_tokens": held + waiting_prompt,
        "num_reqs": running + len(scheduler.waiting),
    }
