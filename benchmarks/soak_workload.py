"""The soak's requests (benchmarks/soak.py) and the bookkeeping checks made on each answer.

Every request asks for a known number of tokens (ignore_eos, max_tokens), so the client can
count what came back: tokens lost or duplicated, and how many times each choice ended (it must
be exactly once). Kinds, picked at random with fixed weights:

- completion / completion_stream: /v1/completions with n in 1..3 and logprobs=1, whose token
  list counts the tokens of every choice (streamed deltas included);
- chat / chat_stream: /v1/chat/completions with n in 1..2;
- json / regex: /generate with a JSON schema or a regex (structured outputs), streamed or not;
  an output that ended with `stop` must parse and match;
- abort: a stream the client closes after a few events (a disconnect: no end is expected).

Equality probes send one prompt twice at temperature 0, streamed and not, and compare the
output ids and text.
"""

from __future__ import annotations

import json
import random
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

PROMPTS = [
    "Tell me about the ocean.",
    "Describe a forest at night.",
    "What makes a good friend?",
    "Explain how a bicycle works.",
    "Why do cats purr?",
    "How is bread made?",
    "What is the tallest mountain?",
    "Write about your favourite season.",
    "List three uses of copper.",
    "What does a lighthouse keeper do?",
]
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
PHONE_REGEX = r"[0-9]{3}-[0-9]{4}"
KINDS = {
    "completion": 3,
    "completion_stream": 3,
    "chat": 2,
    "chat_stream": 2,
    "json": 1,
    "regex": 1,
    "abort": 1,
}


@dataclass
class Outcome:
    """What one request did, as the client saw it."""

    kind: str
    n: int
    stream: bool
    status: int = 0
    latency_s: float = 0.0
    ends: int = 0  # finish reasons seen, over all choices
    expected_ends: int = 0  # choices that had to end (0 for a client abort)
    lost_tokens: int = 0
    duplicated_tokens: int = 0
    aborted_by_client: bool = False
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sse_data(lines: list[str]) -> list[Any]:
    """The data events of an SSE body; `[DONE]` stays a string."""
    out: list[Any] = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def pick_kind(rng: random.Random) -> str:
    kinds = list(KINDS)
    return rng.choices(kinds, weights=[KINDS[k] for k in kinds])[0]


async def run_one(
    client: httpx.AsyncClient, base: str, kind: str, rng: random.Random, max_tokens: int = 32
) -> Outcome:
    """One request of `kind` asking for up to `max_tokens` tokens per choice."""
    prompt = rng.choice(PROMPTS)
    top = max_tokens
    max_tokens = rng.randint(max(1, top // 4), top)
    started = time.monotonic()
    try:
        if kind in ("completion", "completion_stream"):
            out = await _completion(client, base, prompt, max_tokens, rng, kind.endswith("stream"))
        elif kind in ("chat", "chat_stream"):
            out = await _chat(client, base, prompt, max_tokens, rng, kind.endswith("stream"))
        elif kind in ("json", "regex"):
            out = await _structured(client, base, prompt, kind, rng.random() < 0.5, top)
        else:
            out = await _abort(client, base, prompt, rng, top)
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        out = Outcome(kind, 1, False, problems=[f"{type(exc).__name__}: {exc}"[:300]])
    out.latency_s = time.monotonic() - started
    return out


def _check_status(out: Outcome, status: int, body: str) -> bool:
    out.status = status
    if status != 200:
        out.problems.append(f"HTTP {status}: {body[:200]}")
        return False
    return True


def _count_tokens(out: Outcome, got: dict[int, int], want: int) -> None:
    for index in range(out.n):
        diff = got.get(index, 0) - want
        if diff > 0:
            out.duplicated_tokens += diff
        else:
            out.lost_tokens -= diff


async def _completion(
    client: httpx.AsyncClient,
    base: str,
    prompt: str,
    max_tokens: int,
    rng: random.Random,
    stream: bool,
) -> Outcome:
    n = rng.randint(1, 3)
    out = Outcome("completion_stream" if stream else "completion", n, stream, expected_ends=n)
    body: dict[str, Any] = {"prompt": prompt, "logprobs": 1}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return await _sampled_run(client, f"{base}/v1/completions", body, out, max_tokens, "tokens")


async def _chat(
    client: httpx.AsyncClient,
    base: str,
    prompt: str,
    max_tokens: int,
    rng: random.Random,
    stream: bool,
) -> Outcome:
    n = rng.randint(1, 2)
    out = Outcome("chat_stream" if stream else "chat", n, stream, expected_ends=n)
    body: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}], "logprobs": True}
    return await _sampled_run(
        client, f"{base}/v1/chat/completions", body, out, max_tokens, "content"
    )


async def _sampled_run(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    out: Outcome,
    max_tokens: int,
    logprob_list: str,
) -> Outcome:
    """Sample `out.n` choices of exactly `max_tokens` tokens (ignore_eos) and count the tokens
    each choice reports through its logprobs list (`logprob_list`: "tokens" for completions,
    "content" for chat), streamed or not."""
    body = {
        **body,
        "max_tokens": max_tokens,
        "n": out.n,
        "temperature": 0.8,
        "ignore_eos": True,
        "stream": out.stream,
    }
    tokens: dict[int, int] = {}
    if not out.stream:
        r = await client.post(url, json=body)
        if not _check_status(out, r.status_code, r.text):
            return out
        for choice in r.json()["choices"]:
            tokens[choice["index"]] = len(choice["logprobs"][logprob_list])
            out.ends += choice["finish_reason"] is not None
            _expect_length(out, choice["finish_reason"])
        _count_tokens(out, tokens, max_tokens)
        return out
    async with client.stream("POST", url, json=body) as r:
        if not _check_status(
            out, r.status_code, (await r.aread()).decode() if r.status_code != 200 else ""
        ):
            return out
        events = sse_data([line async for line in r.aiter_lines()])
    _check_done(out, events)
    for event in events:
        if not isinstance(event, dict):
            continue
        for choice in event.get("choices") or []:
            idx = choice["index"]
            listed = (choice.get("logprobs") or {}).get(logprob_list) or []
            tokens[idx] = tokens.get(idx, 0) + len(listed)
            if choice.get("finish_reason") is not None:
                out.ends += 1
                _expect_length(out, choice["finish_reason"])
    _count_tokens(out, tokens, max_tokens)
    return out


def _expect_length(out: Outcome, reason: Any) -> None:
    if reason != "length":
        out.problems.append(f"finish_reason {reason!r}, expected 'length' (ignore_eos)")


def _check_done(out: Outcome, events: list[Any]) -> None:
    done = sum(1 for e in events if e == "[DONE]")
    if done != 1 or events[-1] != "[DONE]":
        out.problems.append(f"{done} [DONE] events, last {str(events[-1:])[:80]}")
    errors = [e for e in events if isinstance(e, dict) and "error" in e]
    if errors:
        out.problems.append(f"error event: {str(errors[0])[:200]}")


async def _structured(
    client: httpx.AsyncClient, base: str, prompt: str, kind: str, stream: bool, top: int
) -> Outcome:
    out = Outcome(kind, 1, stream, expected_ends=1)
    # Room for the whole JSON object; a shorter run may end with `length`, which is allowed.
    params: dict[str, Any] = {"max_new_tokens": max(16, top * 3 // 2), "temperature": 0}
    if kind == "json":
        params["json_schema"] = json.dumps(PERSON_SCHEMA)
        text = f"Invent a person for this story: {prompt} Answer in JSON."
    else:
        params["regex"] = PHONE_REGEX
        text = f"{prompt} Now write a phone number:"
    body = {"text": text, "sampling_params": params, "stream": stream}
    if not stream:
        r = await client.post(f"{base}/generate", json=body)
        if not _check_status(out, r.status_code, r.text):
            return out
        final = r.json()
    else:
        async with client.stream("POST", f"{base}/generate", json=body) as r:
            if not _check_status(
                out, r.status_code, (await r.aread()).decode() if r.status_code != 200 else ""
            ):
                return out
            events = sse_data([line async for line in r.aiter_lines()])
        _check_done(out, events)
        chunks = [e for e in events if isinstance(e, dict) and "meta_info" in e]
        _check_cumulative(out, chunks)
        if not chunks:
            out.problems.append("no chunk in the stream")
            return out
        final = chunks[-1]
        out.ends = sum(1 for c in chunks if c["meta_info"].get("finish_reason"))
    if not stream:
        out.ends = 1 if final["meta_info"].get("finish_reason") else 0
    ids, meta = final["output_ids"], final["meta_info"]
    if len(ids) != meta["completion_tokens"]:
        diff = len(ids) - meta["completion_tokens"]
        out.duplicated_tokens += max(diff, 0)
        out.lost_tokens += max(-diff, 0)
    reason = (meta.get("finish_reason") or {}).get("type")
    if reason == "stop":
        _check_structured(out, kind, final["text"])
    elif reason != "length":
        out.problems.append(f"finish {reason!r}")
    return out


def _check_cumulative(out: Outcome, chunks: list[dict[str, Any]]) -> None:
    """Native streams carry cumulative output_ids: each must extend the last by new tokens."""
    seen: list[int] = []
    for chunk in chunks:
        ids = list(chunk.get("output_ids") or [])
        if ids[: len(seen)] != seen:
            out.problems.append("a stream chunk rewrote earlier tokens")
        if len(ids) <= len(seen) and not chunk["meta_info"].get("finish_reason"):
            out.duplicated_tokens += 1  # an empty or repeated chunk
        seen = ids


def _check_structured(out: Outcome, kind: str, text: str) -> None:
    if kind == "regex":
        if not re.fullmatch(PHONE_REGEX, text):
            out.problems.append(f"regex output {text!r} does not match")
        return
    try:
        value = json.loads(text)
    except ValueError:
        out.problems.append(f"json output {text[:80]!r} does not parse")
        return
    if not (isinstance(value, dict) and set(value) == {"name", "age"}):
        out.problems.append(f"json output {text[:80]!r} does not fit the schema")


async def _abort(
    client: httpx.AsyncClient, base: str, prompt: str, rng: random.Random, top: int
) -> Outcome:
    out = Outcome("abort", 1, True, aborted_by_client=True)
    body = {"prompt": prompt, "max_tokens": top * 2, "ignore_eos": True, "stream": True}
    close_after = rng.randint(1, 6)
    seen = 0
    async with client.stream("POST", f"{base}/v1/completions", json=body) as r:
        out.status = r.status_code
        if r.status_code != 200:
            out.problems.append(f"HTTP {r.status_code}")
            return out
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                seen += 1
                if seen >= close_after:
                    break  # leaving the block closes the connection mid-stream
    return out


async def equality_probe(client: httpx.AsyncClient, base: str, prompt: str) -> dict[str, Any]:
    """One greedy prompt, non-streamed then streamed: the same ids and text, or says how not."""
    params = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
    body = {"text": prompt, "sampling_params": params}
    r = await client.post(f"{base}/generate", json=body)
    r.raise_for_status()
    plain = r.json()
    async with client.stream("POST", f"{base}/generate", json={**body, "stream": True}) as s:
        s.raise_for_status()
        events = sse_data([line async for line in s.aiter_lines()])
    chunks = [e for e in events if isinstance(e, dict) and "meta_info" in e]
    last = chunks[-1] if chunks else {"output_ids": [], "text": ""}
    equal = last["output_ids"] == plain["output_ids"] and last["text"] == plain["text"]
    return {
        "time": time.time(),
        "prompt": prompt,
        "equal": equal,
        "tokens": len(plain["output_ids"]),
        "plain_text": None if equal else plain["text"],
        "stream_text": None if equal else last["text"],
    }
