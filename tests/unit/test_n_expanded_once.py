"""`n` is expanded once: the HTTP routes make one engine request per sample (sample_copies) and
hand the engine sampling params without `n`, so the engine's own expansion (expand_call) never
multiplies them again."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.test_http_fakes import MODEL, make_client

CHAT = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(
    ("path", "body", "results"),
    [
        ("/generate", {"text": ["a", "b"], "sampling_params": {"max_new_tokens": 2, "n": 3}}, 6),
        ("/v1/completions", {"model": MODEL, "prompt": ["a", "b"], "max_tokens": 2, "n": 3}, 6),
        ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 2, "n": 3}, 3),
    ],
)
def test_the_engine_gets_one_request_per_sample_and_no_n(
    path: str, body: dict[str, Any], results: int
) -> None:
    with make_client() as (client, engine):
        r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert len(got if isinstance(got, list) else got["choices"]) == results
    [call] = engine.calls  # one engine call for the whole request
    params = call["sampling_params"]
    assert len(params) == results and all("n" not in p for p in params)
    assert len(set(call["rid"])) == results  # each sample its own request id
