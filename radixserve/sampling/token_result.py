"""What one step produced for one request: its tokens (with the logprobs asked for) or its
embedding. The step runner (managers/step_runner.py) hands the scheduler a list of
TokenResults per request (one for plain decoding, several where a speculative round accepted
drafts, speculative/verify.py), which it applies to the request in order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class TokenOutputs(Protocol):
    """The request fields a token result writes (managers/schedule_batch.Req has them)."""

    output_ids: list[int]
    return_logprob: bool
    top_logprobs_num: int
    token_ids_logprob: list[int] | None
    output_token_logprobs: list[tuple[float, int]]
    output_top_logprobs: list[list[tuple[float, int]]]
    output_token_ids_logprobs: list[list[tuple[float, int]]]


class EmbeddingOutput(Protocol):
    embedding: list[float] | None


@dataclass
class TokenResult:
    """One generated token of a request that reached the end of its tokens."""

    token_id: int
    logprob: float
    top_logprobs: list[tuple[float, int]] = field(default_factory=list)
    ids_logprobs: list[tuple[float, int]] = field(default_factory=list)

    def apply(self, req: TokenOutputs) -> None:
        req.output_ids.append(self.token_id)
        if req.return_logprob:
            req.output_token_logprobs.append((self.logprob, self.token_id))
            if req.top_logprobs_num:
                req.output_top_logprobs.append(self.top_logprobs)
            if req.token_ids_logprob:
                req.output_token_ids_logprobs.append(self.ids_logprobs)


@dataclass
class EmbeddingResult:
    vector: list[float]

    def apply(self, req: EmbeddingOutput) -> None:
        req.embedding = self.vector
