"""The speculative decoding fields of a response's meta_info, under SGLang's names."""

from __future__ import annotations

from typing import Any


def spec_meta_info(
    verify_ct: int, accepted: int, drafted: int, completion_tokens: int
) -> dict[str, Any]:
    """SGLang's figures: spec_accept_length is completion tokens per verify round (how many
    tokens one target forward yields), spec_accept_rate accepted / proposed drafts; the raw
    counts appear once there has been a verify round."""
    meta: dict[str, Any] = {
        "spec_verify_ct": verify_ct,
        "spec_accept_rate": accepted / drafted if drafted else 0.0,
        "spec_accept_length": completion_tokens / verify_ct if verify_ct else 0.0,
    }
    if verify_ct:
        meta["spec_accept_token_num"] = accepted
        meta["spec_draft_token_num"] = drafted
    return meta
