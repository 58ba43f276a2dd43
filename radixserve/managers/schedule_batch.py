"""CPU-side request state (Req) and the plan for one forward step (ScheduledBatch)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from radixserve.messages import FinishReason

if TYPE_CHECKING:
    from radixserve.sampling.sampling_params import SamplingParams
    from radixserve.speculative.draft_tree import DraftTree


@dataclass
class Req:
    """One generation request as the scheduler sees it.

    KV bookkeeping: req_to_token[req_pool_idx, :kv_len] holds the KV slots of fill_ids[:kv_len].
    The first `cached_len` of them belong to the prefix cache (locked through `last_node`); the
    rest belong to this request until it is released.
    """

    rid: str
    origin_input_ids: list[int]
    sampling_params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    token_ids_logprob: list[int] | None = None
    priority: int = 0
    arrival_time: float = field(default_factory=time.monotonic)
    is_embedding: bool = False
    embedding: list[float] | None = None
    grammar: Any = None  # a GrammarMatcher for constrained requests
    lora_id: int = 0  # the LoRA adapter it runs with (0: the base model); its KV namespace
    # When it first entered a batch (None: never ran): the waiting/running time limits.
    first_scheduled_time: float | None = None
    session_id: str | None = None
    # SGLang's serialized processor string (loaded and cached by sampling.custom_logit_processor)
    # and, when it failed on this request's logits, why (the scheduler ends the request).
    custom_logit_processor: str | None = None
    custom_logit_error: str | None = None
    # return_routed_experts: its ids by position while it runs (managers/routed_experts.py),
    # dropped once sent.
    return_routed_experts: bool = False
    routed_experts_start_len: int = 0  # the ids of positions before it are not returned
    routed_experts: Any = None
    # A vision model's images (multimodal/image_items.py's ImageItem), in prompt order, and the
    # prompt as the prefix cache keys it: each image's placeholder tokens replaced by a value
    # derived from the image's hash (None: the prompt itself).
    images: list[Any] = field(default_factory=list)
    origin_key_ids: list[int] | None = None
    # An M-RoPE model's positions for this request (multimodal/mrope_positions.py's
    # MRopePositions; None: plain positions, as for a request without images).
    mrope: Any = None
    # Prefill/decode disaggregation (managers/disagg_*.py): its room on the prefill server;
    # kv_received once a decode server holds its prompt's KV (a retracted request then
    # recomputes it locally like any other).
    bootstrap: Any = None
    kv_received: bool = False

    output_ids: list[int] = field(default_factory=list)
    finished_reason: FinishReason | None = None

    req_pool_idx: int | None = None
    kv_len: int = 0
    cached_len: int = 0
    last_node: Any = None
    cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    # With --enable-hierarchical-cache: cached_tokens split by tier (device, host, storage).
    cached_tokens_details: dict[str, int] | None = None
    admitted_once: bool = False
    num_retractions: int = 0
    # Index into output_ids of the first token not yet sent to the client.
    sent_offset: int = 0
    output_token_logprobs: list[tuple[float, int]] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    output_token_ids_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_token_ids_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)
    input_token_logprobs: list[tuple[float | None, int]] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)
    # Set when the tokenizer's text view is needed for stop strings.
    tail_text: str = ""
    # Speculative decoding (radixserve/speculative/): the drafter's per-request state, and
    # SGLang's per-request counters: verify rounds, drafts proposed, drafts accepted.
    spec_state: Any = None
    spec_budget: Any = None  # speculative/adaptive.py's DraftBudget under --speculative-adaptive
    output_counts: Any = None  # sampling/output_counts.py's OutputTokenCounts, with penalties
    spec_verify_ct: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0

    @property
    def fill_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    def fill_slice(self, start: int, end: int) -> list[int]:
        """fill_ids[start:end] without building fill_ids (a decode step reads one token of
        each request; concatenating the prompt and the output each time copied both)."""
        prompt = len(self.origin_input_ids)
        if start >= prompt:
            return self.output_ids[start - prompt : end - prompt]
        if end <= prompt:
            return self.origin_input_ids[start:end]
        return self.origin_input_ids[start:] + self.output_ids[: end - prompt]

    @property
    def last_token(self) -> int:
        """fill_ids[-1]."""
        return self.output_ids[-1] if self.output_ids else self.origin_input_ids[-1]

    @property
    def key_ids(self) -> list[int]:
        """fill_ids as the prefix cache keys them (see origin_key_ids)."""
        if self.origin_key_ids is None:
            return self.fill_ids
        return self.origin_key_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None

    @property
    def max_new_tokens(self) -> int:
        value = self.sampling_params.max_new_tokens
        return 0 if value is None else value

    def remaining_new_tokens(self) -> int:
        return max(self.max_new_tokens - len(self.output_ids), 0)

    def needs_input_logprobs(self) -> bool:
        return self.return_logprob and self.logprob_start_len >= 0


@dataclass
class ScheduledBatch:
    """What to run this step: for each request, `extend_lens[i]` tokens starting at its kv_len.

    A request whose extend reaches the end of its fill_ids gets a token sampled; a chunked
    request (extend stops short) does not.
    """

    reqs: list[Req]
    extend_lens: list[int]
    # A round of the running requests alone: each extends by its next token (1 + its drafts
    # in a speculative round), no prompt tokens. (StepInputs.is_decode is another thing: whether
    # a forward may take the decode kernels; ForwardMode follows StepInputs.)
    decode_round: bool
    # Prefill entries come first; in a mixed batch the running decodes follow them.
    num_prefill_reqs: int | None = None
    # A speculative decode round: each request's draft tree (extend_lens[i] = 1 + len).
    drafts: list[DraftTree] | None = None

    def __post_init__(self) -> None:
        if self.num_prefill_reqs is None:
            self.num_prefill_reqs = 0 if self.decode_round else len(self.reqs)

    def __len__(self) -> int:
        return len(self.reqs)


@dataclass
class SchedulerStats:
    """Counters since start (what /metrics and /server_info report)."""

    prompt_tokens: int = 0  # prompt tokens of admitted requests
    cached_prompt_tokens: int = 0  # of those, served from the prefix cache
    cached_host_tokens: int = 0  # of those, loaded back from the host tier
    cached_storage_tokens: int = 0  # of those, loaded back from the disk tier
    prefill_tokens: int = 0  # tokens actually run through prefill (recomputation included)
    generated_tokens: int = 0
    retractions: int = 0
    # Speculative decoding: request-rounds verified, drafts proposed, drafts accepted.
    spec_verify_rounds: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
