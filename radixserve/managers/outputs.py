"""What a generation (or embedding) request hands back to the API layers: typed objects read
by attribute. Only the JSON edges (the native /generate and /encode routes, the offline Engine's
generate and encode, which return SGLang's dicts) call `to_json`, which gives SGLang's shape:
{"text", "output_ids", "meta_info": {...}} or {"embedding", "meta_info": {...}}."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixserve.messages import FinishReason
from radixserve.speculative.meta import SpecMeta

# SGLang's logprob entry: [logprob, token id, token text or None]; the text is filled in only
# when a client asks for it (return_text_in_logprobs).
LogprobEntry = list[Any]
# Per position, the entries of its top (or named-ids) logprobs; None where there are none.
TopEntries = list[LogprobEntry] | None


@dataclass(frozen=True, slots=True)
class MetaInfo:
    """SGLang's meta_info. The optional groups are None when the request did not produce them
    and are then absent from the JSON: cached_tokens_details (hierarchical cache),
    routed_experts (the final output of a request that asked), spec (speculative decoding on),
    the four logprob lists (return_logprob), the two token-ids lists (token_ids_logprob), and
    weight_version (added by the native /generate route)."""

    id: str
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    num_retractions: int
    e2e_latency: float
    cached_tokens_details: dict[str, int] | None = None
    routed_experts: str | None = None
    spec: SpecMeta | None = None
    # Cumulative over the request so far (a stream's chunks carry the whole lists).
    output_token_logprobs: list[LogprobEntry] | None = None
    output_top_logprobs: list[TopEntries] | None = None
    input_token_logprobs: list[LogprobEntry] | None = None
    input_top_logprobs: list[TopEntries] | None = None
    output_token_ids_logprobs: list[TopEntries] | None = None
    input_token_ids_logprobs: list[TopEntries] | None = None
    weight_version: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def aborted(self) -> bool:
        return self.finish_reason is not None and self.finish_reason.type == "abort"

    def to_json(self) -> dict[str, Any]:
        # Key order is SGLang's (and this server's before the typed outputs): clients that
        # compare raw bodies see the same bytes.
        out: dict[str, Any] = {
            "id": self.id,
            "finish_reason": (
                self.finish_reason.to_json() if self.finish_reason is not None else None
            ),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "num_retractions": self.num_retractions,
            "e2e_latency": self.e2e_latency,
        }
        if self.cached_tokens_details is not None:
            out["cached_tokens_details"] = self.cached_tokens_details
        if self.routed_experts is not None:
            out["routed_experts"] = self.routed_experts
        if self.spec is not None:
            out.update(self.spec.to_json())
        if self.output_token_logprobs is not None:
            out["output_token_logprobs"] = self.output_token_logprobs
            out["output_top_logprobs"] = self.output_top_logprobs
            out["input_token_logprobs"] = self.input_token_logprobs
            out["input_top_logprobs"] = self.input_top_logprobs
        if self.output_token_ids_logprobs is not None:
            out["output_token_ids_logprobs"] = self.output_token_ids_logprobs
            out["input_token_ids_logprobs"] = self.input_token_ids_logprobs
        if self.weight_version is not None:
            out["weight_version"] = self.weight_version
        return out


@dataclass(frozen=True, slots=True)
class GenerateOutput:
    """One result or stream chunk. A generation has text and output_ids: in a stream chunk
    the new text and ids only, in a final result all of them. An embedding has `embedding`
    instead (text and output_ids None)."""

    meta_info: MetaInfo
    text: str | None = None
    output_ids: list[int] | None = None
    embedding: list[float] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.text is not None:
            out["text"] = self.text
        if self.output_ids is not None:
            out["output_ids"] = self.output_ids
        if self.embedding is not None:
            out["embedding"] = self.embedding
        out["meta_info"] = self.meta_info.to_json()
        return out
