"""Forming each step's batch: which requests run and how many tokens each brings.

Prefill has priority over decode. A prefill admits waiting requests in --schedule-policy order
under PrefillAdder's budgets (KV after the running requests' reserve, --max-prefill-tokens,
--chunked-prefill-size); a decode step first makes room for one more token per running request
(or a speculative round's drafts), retracting requests back to the queue if the KV pool is
short. With --enable-mixed-chunk the running requests' tokens ride along with the prefill.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from radixserve.managers.image_chunking import (
    check_chunk_size,
    mrope_step_limits,
    whole_image_take,
)
from radixserve.managers.retraction import NewTokenRatio, retraction_order
from radixserve.managers.schedule_batch import Req, ScheduledBatch, SchedulerStats
from radixserve.managers.schedule_policy import PrefillAdder, SchedulePolicy
from radixserve.messages import FinishReason

if TYPE_CHECKING:
    from radixserve.managers.kv_manager import KVManager
    from radixserve.managers.lora_scheduling import LoRAScheduling
    from radixserve.managers.request_queues import RequestQueues
    from radixserve.managers.runtime_control import Preemption
    from radixserve.server_args import ServerArgs
    from radixserve.speculative.worker import SpecWorker

logger = logging.getLogger(__name__)

# A running request's future tokens counted against a new prefill's KV budget, at most.
_RESERVE_CAP = 4096


@dataclass(frozen=True)
class BatchLimits:
    max_running_requests: int
    max_prefill_tokens: int
    chunk_size: int | None  # --chunked-prefill-size; None: prompts are not chunked
    page_size: int
    radix_enabled: bool
    mixed_chunk: bool  # --enable-mixed-chunk (off with speculative decoding)
    retraction_policy: str
    decode_width: int  # slots a running request may take in one decode round
    # Gemma 3's image tokens attend to each other both ways: no chunk may end inside one.
    keep_images_whole: bool = False

    @classmethod
    def from_args(
        cls,
        args: ServerArgs,
        model: Any,
        context_len: int,
        max_running_requests: int,
        *,
        decode_width: int,
        speculative: bool,
    ) -> BatchLimits:
        """The limits from the options, with the rules a model's images impose."""
        chunk = args.chunked_prefill_size
        chunk_size = None if chunk is None or chunk <= 0 else chunk
        keep_images_whole = bool(getattr(model, "keep_images_whole", False))
        if keep_images_whole:
            check_chunk_size(chunk_size, int(model.tokens_per_image))
        max_prefill_tokens = args.max_prefill_tokens
        if getattr(model, "image_layout", None) == "grid":
            # M-RoPE (layers/mrope.py) has context-length scratch rows for a step's image
            # tokens: no prefill step may hold more tokens than that.
            max_prefill_tokens, chunk_size = mrope_step_limits(
                max_prefill_tokens, chunk_size, context_len
            )
        return cls(
            max_running_requests=max_running_requests,
            max_prefill_tokens=max_prefill_tokens,
            chunk_size=chunk_size,
            page_size=args.page_size,
            radix_enabled=not args.disable_radix_cache,
            mixed_chunk=bool(args.enable_mixed_chunk) and not speculative,
            retraction_policy=args.retraction_policy,
            decode_width=decode_width,
            keep_images_whole=keep_images_whole,
        )


class BatchFormer:
    def __init__(
        self,
        limits: BatchLimits,
        queues: RequestQueues,
        kv: KVManager,
        policy: SchedulePolicy,
        ratio: NewTokenRatio,
        stats: SchedulerStats,
        lora: LoRAScheduling,
        preemption: Preemption,
        spec: SpecWorker | None,
        finish: Callable[[Req, FinishReason], None],
    ) -> None:
        self.limits = limits
        self.queues = queues
        self.kv = kv
        self.policy = policy
        self.ratio = ratio
        self.stats = stats
        self.lora = lora
        self.preemption = preemption
        self.spec = spec
        self.finish = finish  # ends a request (the decode that cannot fit even alone)
        self.admit_new = True  # False while a weight update waits for started requests

    def schedule(self) -> ScheduledBatch | None:
        q = self.queues
        if self.limits.mixed_chunk and q.running:
            return self._schedule_mixed()
        prefill = self._schedule_prefill()
        if prefill is not None:
            return prefill
        if not q.running:
            return None
        if not self._reserve_decode_slots():
            return None
        if self.spec is not None:
            drafts = self.spec.propose(q.running)
            widths = [1 + len(d) for d in drafts]
            self._alloc_decode_slots(widths)
            return ScheduledBatch(list(q.running), widths, decode_round=True, drafts=drafts)
        self._alloc_decode_slots()
        return ScheduledBatch(list(q.running), [1] * len(q.running), decode_round=True)

    def _schedule_mixed(self) -> ScheduledBatch | None:
        """The running requests' next tokens ride along with a prefill.

        Their slots are reserved (retracting, or giving back the chunked prompt, if needed)
        before the prefill is budgeted, so nothing the prefill admits can be released again
        while the batch is being built; the prefill gets whatever KV is left.
        """
        running = self.queues.running
        decoding = self._reserve_decode_slots()
        if decoding:
            self._alloc_decode_slots()
        prefill = self._schedule_prefill()
        if prefill is None:
            if not decoding:
                return None
            return ScheduledBatch(list(running), [1] * len(running), decode_round=True)
        if decoding:
            prefill.num_prefill_reqs = len(prefill.reqs)
            prefill.reqs.extend(running)
            prefill.extend_lens.extend([1] * len(running))
        return prefill

    def _alloc_decode_slots(self, widths: Sequence[int] | None = None) -> None:
        """Slots for every running request's next token (and, in a speculative round, its
        drafts: widths[i] = 1 + drafts), allocated for the whole batch at once."""
        if self.kv.alloc_decode(self.queues.running, widths) is None:
            # _reserve_decode_slots made room before this was called.
            raise RuntimeError("KV allocation failed for the decode batch after reserving")

    def _schedule_prefill(self) -> ScheduledBatch | None:
        q, limits = self.queues, self.limits
        if not q.waiting and q.chunked_req is None:
            return None
        if self.preemption.enabled and q.running and q.waiting:
            self._preempt_for_priority()
        adder = PrefillAdder(
            rem_total_tokens=self.kv.available_tokens() - self._reserve(q.running),
            rem_input_tokens=limits.max_prefill_tokens,
            rem_chunk_tokens=limits.chunk_size,
            new_token_ratio=self.ratio.value,
            page_size=limits.page_size,
        )
        if q.chunked_req is not None:
            req, q.chunked_req = q.chunked_req, None
            if not self._add_admitted(adder, req):
                q.chunked_req = req  # no room this round; keep its KV and retry
                return None
        for req in self.policy.order(q.waiting, self.kv):
            if adder.chunked_req is not None:
                break
            if not self.admit_new and req.first_scheduled_time is None:
                continue  # a weight update waits for the started requests only
            if len(q.running) + len(adder.reqs) >= limits.max_running_requests:
                break
            if limits.radix_enabled and _shares_uncached_prefix(req, adder.reqs):
                continue  # next round it finds that prefix in the cache
            if req.lora_id and not self.lora.fits_batch(req, [*q.running, *adder.reqs]):
                continue  # --max-loras-per-batch adapters already run; it waits for a slot
            if not self._admit_waiting(adder, req):
                break
        admitted = {id(r) for r in adder.reqs}
        q.waiting = [r for r in q.waiting if id(r) not in admitted]
        q.chunked_req = adder.chunked_req
        if not adder.reqs:
            return None
        return ScheduledBatch(adder.reqs, adder.extend_lens, decode_round=False)

    def _reserve(self, running: Sequence[Req]) -> int:
        """KV tokens kept back for the running requests' future tokens (new_token_ratio)."""
        return int(
            sum(min(r.remaining_new_tokens(), _RESERVE_CAP) for r in running) * self.ratio.value
        )

    def _admit_waiting(self, adder: PrefillAdder, req: Req) -> bool:
        page = self.limits.page_size
        prefix, node = self.kv.match_prefix(req)
        if req.needs_input_logprobs():
            # Positions inside a cached prefix get no logits; keep those the client asked for.
            keep = max(req.logprob_start_len - 1, 0) // page * page
            prefix = prefix[: min(len(prefix), keep)]
        if req.return_routed_experts:
            # Its ids cover every position from routed_experts_start_len on, and only a
            # forward of this request routes them: the cache may serve the positions before.
            keep = req.routed_experts_start_len // page * page
            prefix = prefix[: min(len(prefix), keep)]
        extend_len = req.seq_len - len(prefix)
        if adder.would_reject(req, extend_len):
            return False
        if not self.kv.admit(req, prefix, node):
            return False
        if not req.admitted_once:
            req.cached_tokens = len(prefix)
            req.admitted_once = True
            self.stats.cached_prompt_tokens += len(prefix)
            self.stats.prompt_tokens += len(req.origin_input_ids)
            if self.kv.hicache is not None:
                self._count_tiers(req, len(prefix))
        if self._add_admitted(adder, req):
            return True
        self.kv.release(req)
        return False

    def _count_tiers(self, req: Req, used: int) -> None:
        # The match may have been cut short (input logprobs); the device part comes first.
        hits = self.kv.last_hits
        device = min(hits.device, used)
        host = min(hits.host, used - device)
        storage = used - device - host
        req.cached_tokens_details = {"device": device, "host": host, "storage": storage}
        self.stats.cached_host_tokens += host
        self.stats.cached_storage_tokens += storage

    def _add_admitted(self, adder: PrefillAdder, req: Req) -> bool:
        """Budget and allocate KV for an admitted request's next extend (whole or chunk)."""
        extend_len = req.seq_len - req.kv_len
        take = adder.plan(req, extend_len, self.kv.tokens_needed(req, extend_len))
        if self.limits.keep_images_whole and req.images and 0 < take < extend_len:
            take = whole_image_take(
                req.images, req.kv_len, take, extend_len, self.limits.page_size, grow=not adder.reqs
            )
        if take == 0:
            return False
        if self.kv.alloc_extend(req, take) is None:
            return False
        adder.commit(req, take, self.kv.tokens_needed(req, take), chunked=take < extend_len)
        return True

    def _reserve_decode_slots(self) -> bool:
        """Make sure every running request can take one more token, retracting if needed."""
        q = self.queues
        width = self.limits.decode_width
        while q.running:
            needed = sum(
                self.kv.tokens_needed(r, min(width, max(r.remaining_new_tokens(), 1)))
                for r in q.running
            )
            if needed <= self.kv.available_tokens():
                return True
            if q.chunked_req is not None:
                self.give_back_chunked()  # a half-prefilled prompt is the cheapest to give back
                continue
            if len(q.running) == 1:
                self.finish(
                    q.running.pop(),
                    FinishReason(
                        "abort",
                        message="Out of memory even after retracting all other requests.",
                        status_code=500,
                    ),
                )
                return False
            self.retract(None)
        return False

    def give_back_chunked(self) -> None:
        """Return the half-prefilled prompt to the front of the queue, freeing its KV."""
        q = self.queues
        req, q.chunked_req = q.chunked_req, None
        if req is not None:
            self.kv.release(req)
            q.waiting.insert(0, req)

    def retract(self, victim: Req | None) -> None:
        """Send a running request (the retraction policy's pick when None) back to the queue;
        it resumes from the prefix cache later, with the same output."""
        q = self.queues
        if victim is None:
            victim = retraction_order(q.running, self.limits.retraction_policy)[0]
        q.running.remove(victim)
        self.kv.release(victim)
        victim.num_retractions += 1
        self.stats.retractions += 1
        q.waiting.insert(0, victim)
        self.ratio.after_retraction(q.running)
        logger.info(
            "Retracted request %s (%d tokens so far); %d still running",
            victim.rid,
            victim.seq_len,
            len(q.running),
        )

    def _preempt_for_priority(self) -> None:
        """Retract running requests of much lower priority when the most urgent waiting
        request cannot start otherwise (no request slot, or not enough KV)."""
        q = self.queues
        head = self.policy.order(q.waiting, self.kv)[0]
        prefix, _ = self.kv.match_prefix(head, update_stats=False)
        need = head.seq_len - len(prefix) + min(head.remaining_new_tokens(), _RESERVE_CAP)

        def fits(gone: Sequence[Req]) -> bool:
            gone_ids = {id(r) for r in gone}
            stay = [r for r in q.running if id(r) not in gone_ids]
            freed = sum(r.kv_len - r.cached_len for r in gone)
            room = self.kv.available_tokens() + freed - self._reserve(stay)
            return len(stay) < self.limits.max_running_requests and room >= need

        if fits([]):
            return
        for victim in self.preemption.victims(head, q.running, fits):
            logger.info("Preempting request %s for higher-priority %s", victim.rid, head.rid)
            self.retract(victim)


# A waiting request that shares at least this many not-yet-cached prompt tokens with a request
# already in this prefill batch waits one round (SGLang's in-batch prefix caching), so the
# prefix is computed once and cached (cache_unfinished) instead of once per request.
IN_BATCH_PREFIX_TOKENS = 32


def _shares_uncached_prefix(req: Req, admitted: Sequence[Req]) -> bool:
    fill = req.key_ids
    for other in admitted:
        if other.lora_id != req.lora_id:  # another adapter's KV is never shared
            continue
        other_fill = other.key_ids
        if not fill or not other_fill or fill[0] != other_fill[0]:
            continue
        # Shorter prompts (n > 1 copies of one prompt, say) wait when all of theirs is covered.
        need = min(IN_BATCH_PREFIX_TOKENS, len(fill) - 1 - other.cached_len)
        if need > 0 and common_prefix_len(fill, other_fill) - other.cached_len >= need:
            return True
    return False


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix, by binary search over C-level slice compares."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
