"""The speculative decoding fields of a response's meta_info, under SGLang's names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class SpecMeta:
    """SGLang's figures: spec_accept_length is completion tokens per verify round (how many
    tokens one target forward yields), spec_accept_rate accepted / proposed drafts. The raw
    counts (spec_accept_token_num, spec_draft_token_num) are None until there has been a
    verify round, and are then left out of the JSON, as SGLang does."""

    spec_verify_ct: int
    spec_accept_rate: float
    spec_accept_length: float
    spec_accept_token_num: int | None = None
    spec_draft_token_num: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "spec_verify_ct": self.spec_verify_ct,
            "spec_accept_rate": self.spec_accept_rate,
            "spec_accept_length": self.spec_accept_length,
        }
        if self.spec_accept_token_num is not None:
            out["spec_accept_token_num"] = self.spec_accept_token_num
            out["spec_draft_token_num"] = self.spec_draft_token_num
        return out


def spec_meta_info(verify_ct: int, accepted: int, drafted: int, completion_tokens: int) -> SpecMeta:
    """The speculative figures of one output from the scheduler's running counters."""
    return SpecMeta(
        spec_verify_ct=verify_ct,
        spec_accept_rate=accepted / drafted if drafted else 0.0,
        spec_accept_length=completion_tokens / verify_ct if verify_ct else 0.0,
        spec_accept_token_num=accepted if verify_ct else None,
        spec_draft_token_num=drafted if verify_ct else None,
    )
