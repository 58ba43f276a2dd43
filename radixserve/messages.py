"""Every payload that crosses a process (or thread) boundary between the API side and the
scheduler. Plain dataclasses of Python values, so they pickle cheaply and carry no tensors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TokenizedGenerateReq:
    rid: str
    input_ids: list[int]
    sampling_params: dict[str, Any]  # SamplingParams.to_dict(), verified by the sender
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    stream: bool = False
    priority: int | None = None


@dataclass
class AbortReq:
    rid: str | None = None  # None with abort_all=True aborts everything
    abort_all: bool = False
    message: str = "Aborted by the client."


@dataclass
class FlushCacheReq:
    pass


@dataclass
class FinishReason:
    """SGLang's shape: {"type": "stop"|"length"|"abort", "matched": ..., "message": ...}."""

    type: str
    matched: int | str | None = None
    message: str | None = None
    status_code: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        if self.type == "abort":
            out["message"] = self.message
            if self.status_code is not None:
                out["status_code"] = self.status_code
        else:
            out["matched"] = self.matched
        return out


@dataclass
class ReqOutput:
    """New tokens for one request since its last output (or everything, when it finished)."""

    rid: str
    new_token_ids: list[int]
    finished: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    num_retractions: int = 0
    # Each entry (logprob, token_id); top entries are lists of the same per position.
    output_token_logprobs: list[tuple[float, int]] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_token_logprobs: list[tuple[float | None, int]] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)
