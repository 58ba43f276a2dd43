"""The fields of the scheduler's live state (/server_info, /get_load, metrics) that belong to
one feature each: the cache tiers, speculative decoding, expert rebalancing, and the load
sglang-router polls. Scheduler.info gathers them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixserve.managers.kv_manager import KVManager
    from radixserve.managers.request_queues import RequestQueues
    from radixserve.managers.schedule_batch import SchedulerStats


def load_fields(kv: KVManager, queues: RequestQueues) -> dict[str, Any]:
    """The load as SGLang reports it on /get_load (sglang-router's power_of_two policy and the
    load column of its /get_loads): tokens the scheduler is committed to, KV held by requests
    (neither free nor evictable cache) plus the prompts still waiting, and the requests."""
    held = kv.allocator.size - kv.available_tokens()
    waiting_prompt = sum(len(req.origin_input_ids) for req in queues.waiting)
    return {
        "num_tokens": held + waiting_prompt,
        "num_reqs": len(queues.in_progress()) + len(queues.waiting),
    }


def tier_fields(kv: KVManager, stats: SchedulerStats) -> dict[str, Any]:
    """Prompt tokens served per cache tier (device / host / storage), with a hierarchical
    cache."""
    if kv.hicache is None:
        return {}
    lower = stats.cached_host_tokens + stats.cached_storage_tokens
    return {
        "cached_tokens_device_total": stats.cached_prompt_tokens - lower,
        "cached_tokens_host_total": stats.cached_host_tokens,
        "cached_tokens_storage_total": stats.cached_storage_tokens,
        **kv.hicache.info(),
    }


def spec_fields(stats: SchedulerStats) -> dict[str, Any]:
    """Speculative decoding's counters and SGLang's figures: tokens per verify round, and
    accepted / proposed drafts."""
    rounds, accepted = stats.spec_verify_rounds, stats.spec_accepted_tokens
    drafts = stats.spec_draft_tokens
    return {
        "spec_verify_rounds_total": rounds,
        "spec_draft_tokens_total": drafts,
        "spec_accepted_tokens_total": accepted,
        "spec_accept_length": (rounds + accepted) / rounds if rounds else 0.0,
        "spec_accept_rate": accepted / drafts if drafts else 0.0,
    }


def eplb_fields(eplb: Any) -> dict[str, Any]:
    """--enable-eplb: rebalances decided and layers whose experts moved so far."""
    if eplb is None:
        return {}
    return {"eplb_rebalances_total": eplb.rebalances, "eplb_layers_moved_total": eplb.layers_moved}
