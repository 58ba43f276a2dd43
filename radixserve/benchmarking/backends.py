"""One benchmark request over HTTP, per API: SGLang's native /generate, OpenAI completions and
OpenAI chat completions; streamed (SSE) unless asked otherwise.

The request bodies follow SGLang's bench_serving: greedy (temperature 0), ignore_eos unless
--disable-ignore-eos, --extra-request-body merged at the top level. Output tokens come from the
server (meta_info.completion_tokens, or usage.completion_tokens; streamed OpenAI requests ask
for a final usage chunk) and otherwise from re-tokenizing the text.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from radixserve.benchmarking.metrics import RequestOutput, StreamTimer

NATIVE, COMPLETIONS, CHAT = "native", "completions", "chat"
BACKENDS: dict[str, str] = {
    "sglang": NATIVE,
    "sglang-native": NATIVE,
    "radixserve": NATIVE,
    "sglang-oai": COMPLETIONS,
    "vllm": COMPLETIONS,
    "lmdeploy": COMPLETIONS,
    "openai": COMPLETIONS,
    "sglang-oai-chat": CHAT,
    "vllm-chat": CHAT,
    "lmdeploy-chat": CHAT,
    "openai-chat": CHAT,
}
ROUTES = {NATIVE: "/generate", COMPLETIONS: "/v1/completions", CHAT: "/v1/chat/completions"}
_ERROR_CHARS = 500


@dataclass(frozen=True)
class RequestSpec:
    api_url: str
    kind: str  # NATIVE, COMPLETIONS or CHAT
    model: str | None
    prompt: str | list[int]
    prompt_len: int
    output_len: int
    stream: bool = True
    ignore_eos: bool = True
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    # --lora-name: the adapter this request runs under (native: lora_path; OpenAI: the model).
    lora_name: str | None = None


def auth_headers() -> dict[str, str]:
    """A bearer token from OPENAI_API_KEY or API_KEY, as SGLang's bench_serving reads them."""
    key = os.environ.get("OPENAI_API_KEY") or os.environ.get("API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def build_payload(spec: RequestSpec) -> dict[str, Any]:
    if spec.kind == NATIVE:
        payload: dict[str, Any] = {
            ("text" if isinstance(spec.prompt, str) else "input_ids"): spec.prompt,
            "sampling_params": {
                "temperature": 0.0,
                "max_new_tokens": spec.output_len,
                "ignore_eos": spec.ignore_eos,
            },
            "stream": spec.stream,
        }
        if spec.lora_name is not None:
            payload["lora_path"] = spec.lora_name
    elif spec.kind == COMPLETIONS:
        payload = {
            "model": spec.lora_name or spec.model,
            "prompt": spec.prompt,
            "temperature": 0.0,
            "best_of": 1,
            "max_tokens": spec.output_len,
            "stream": spec.stream,
            "ignore_eos": spec.ignore_eos,
        }
    elif spec.kind == CHAT:
        payload = {
            "model": spec.lora_name or spec.model,
            "messages": [{"role": "user", "content": spec.prompt}],
            "temperature": 0.0,
            "max_completion_tokens": spec.output_len,
            "stream": spec.stream,
            "ignore_eos": spec.ignore_eos,
        }
    else:
        raise ValueError(f"unknown request kind {spec.kind!r}")
    if spec.stream and spec.kind != NATIVE:
        payload["stream_options"] = {"include_usage": True}
    payload.update(spec.extra_body)
    return payload


async def _sse_events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    async for line in response.aiter_lines():
        line = line.strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data and data != "[DONE]":
            yield json.loads(data)


def _read_usage(out: RequestOutput, usage: Mapping[str, Any] | None) -> int | None:
    """Record prompt/cached tokens from an OpenAI usage block; the completion tokens."""
    if not usage:
        return None
    out.server_prompt_tokens = usage.get("prompt_tokens")
    details = usage.get("prompt_tokens_details") or {}
    if details.get("cached_tokens") is not None:
        out.cached_tokens = int(details["cached_tokens"])
    value = usage.get("completion_tokens")
    return int(value) if value is not None else None


def _read_meta(out: RequestOutput, meta: Mapping[str, Any]) -> int | None:
    if meta.get("prompt_tokens") is not None:
        out.server_prompt_tokens = int(meta["prompt_tokens"])
    if meta.get("cached_tokens") is not None:
        out.cached_tokens = int(meta["cached_tokens"])
    value = meta.get("completion_tokens")
    return int(value) if value is not None else None


def _openai_text(kind: str, body: Mapping[str, Any], streamed: bool) -> str:
    choices = body.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if kind == COMPLETIONS:
        return str(choice.get("text") or "")
    part = choice.get("delta" if streamed else "message") or {}
    return str(part.get("content") or "")


async def _read_stream(
    spec: RequestSpec, response: httpx.Response, out: RequestOutput, timer: StreamTimer
) -> int | None:
    """Consume the SSE stream; returns the server's completion-token count if it gave one."""
    completion: int | None = None
    async for event in _sse_events(response):
        now = time.perf_counter()
        if spec.kind == NATIVE:
            text = str(event.get("text") or "")
            count = _read_meta(out, event.get("meta_info") or {})
            if text:
                out.generated_text = text  # cumulative, as SGLang streams it
                timer.chunk(now, count)
            completion = count if count is not None else completion
        else:
            text = _openai_text(spec.kind, event, streamed=True)
            if text:
                out.generated_text += text
                timer.chunk(now)
            usage_count = _read_usage(out, event.get("usage"))
            completion = usage_count if usage_count is not None else completion
    return completion


async def send_request(
    client: httpx.AsyncClient, spec: RequestSpec, count_tokens: Callable[[str], int]
) -> RequestOutput:
    """Send one request and time it; failures are recorded in the output, never raised."""
    out = RequestOutput(prompt_len=spec.prompt_len)
    start = out.start_time = time.perf_counter()
    timer = StreamTimer(start)
    completion: int | None = None
    try:
        payload = build_payload(spec)
        async with client.stream("POST", spec.api_url, json=payload, headers=auth_headers()) as r:
            if r.status_code != 200:
                body = (await r.aread()).decode(errors="replace")
                out.error = f"HTTP {r.status_code}: {body[:_ERROR_CHARS]}"
                return out
            if spec.stream:
                completion = await _read_stream(spec, r, out, timer)
            else:
                body = json.loads(await r.aread())
                if isinstance(body, list):
                    body = body[0]
                if spec.kind == NATIVE:
                    out.generated_text = str(body.get("text") or "")
                    completion = _read_meta(out, body.get("meta_info") or {})
                else:
                    out.generated_text = _openai_text(spec.kind, body, streamed=False)
                    completion = _read_usage(out, body.get("usage"))
    except (httpx.HTTPError, ValueError, OSError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
        return out
    out.latency = time.perf_counter() - start
    out.ttft = timer.ttft if timer.ttft is not None else out.latency
    out.itl = timer.itl
    out.output_len = completion if completion is not None else count_tokens(out.generated_text)
    out.success = True
    return out
