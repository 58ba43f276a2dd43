"""Pieces shared by the completions and chat handlers: ids, finish reasons, usage, logprobs."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from radixserve.entrypoints.openai.errors import ApiError, scrub
from radixserve.managers.outputs import MetaInfo


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now_s() -> int:
    return int(time.time())


class Finish(NamedTuple):
    reason: str | None  # "stop" | "length" | "abort" | None while running
    matched: Any


def finish_of(meta: MetaInfo) -> Finish:
    """OpenAI's finish_reason from SGLang's; an abort carrying an error status is raised."""
    reason = meta.finish_reason
    if reason is None:
        return Finish(None, None)
    if reason.type == "abort":
        status = reason.status_code
        if isinstance(status, int) and status >= 400:
            message = reason.message or "The request was aborted."
            raise ApiError(status, scrub(str(message)))
        return Finish("abort", None)
    return Finish(reason.type, reason.matched)


def include_usage(ctx: Any, stream_options: Any) -> bool:
    if stream_options is not None and stream_options.include_usage:
        return True
    return bool(ctx.config.stream_response_default_include_usage)


def usage_of(metas: Sequence[MetaInfo | None], n: int, cache_report: bool) -> dict[str, Any]:
    """Usage over items ordered prompt-major (`n` samples per prompt): each prompt counts once.
    An item without a final meta info (a stream that ended early) counts nothing."""
    firsts = [m for i, m in enumerate(metas) if i % n == 0 and m is not None]
    prompt = sum(m.prompt_tokens for m in firsts)
    cached = sum(m.cached_tokens for m in firsts)
    completion = sum(m.completion_tokens for m in metas if m is not None)
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    # SGLang reports cached prompt tokens only with --enable-cache-report.
    usage["prompt_tokens_details"] = {"cached_tokens": cached} if cache_report else None
    return usage


def with_sgl_ext(choice: dict[str, Any], meta: MetaInfo, req: Any) -> dict[str, Any]:
    """`choice` with SGLang's `sgl_ext` extras for a request that set return_routed_experts
    (the routed experts arrive with the finished output only); unchanged otherwise, so plain
    responses keep OpenAI's shape."""
    if getattr(req, "return_routed_experts", False) and meta.routed_experts is not None:
        choice["sgl_ext"] = {"routed_experts": meta.routed_experts}
    return choice


class LogprobFormatter:
    """Turns SGLang's `[logprob, token_id, text]` entries into OpenAI's logprob shapes."""

    def __init__(self, decode: Callable[[int], str]) -> None:
        self._decode = decode
        self._cache: dict[int, str] = {}

    def text(self, token_id: int) -> str:
        if token_id not in self._cache:
            self._cache[token_id] = self._decode(token_id)
        return self._cache[token_id]

    def completion(
        self, entries: Sequence[Sequence[Any]], tops: Sequence[Any], offset: int
    ) -> dict[str, Any]:
        tokens, logprobs, top_list, offsets = [], [], [], []
        for i, entry in enumerate(entries):
            tok = self.text(int(entry[1]))
            tokens.append(tok)
            logprobs.append(entry[0])
            offsets.append(offset)
            offset += len(tok)
            top = tops[i] if i < len(tops) else None
            top_list.append({self.text(int(t[1])): t[0] for t in top} if top is not None else None)
        return {
            "tokens": tokens,
            "token_logprobs": logprobs,
            "top_logprobs": top_list,
            "text_offset": offsets,
        }

    def _chat_entry(self, logprob: Any, token_id: int) -> dict[str, Any]:
        tok = self.text(token_id)
        return {"token": tok, "logprob": logprob, "bytes": list(tok.encode("utf-8"))}

    def chat(self, entries: Sequence[Sequence[Any]], tops: Sequence[Any]) -> list[dict[str, Any]]:
        out = []
        for i, entry in enumerate(entries):
            item = self._chat_entry(entry[0], int(entry[1]))
            top = tops[i] if i < len(tops) else None
            item["top_logprobs"] = [self._chat_entry(t[0], int(t[1])) for t in (top or [])]
            out.append(item)
        return out


class LogprobCursor:
    """Streams carry cumulative logprob lists; this hands out the entries not yet sent."""

    def __init__(self) -> None:
        self.sent = 0

    def take(self, meta: MetaInfo) -> tuple[list[Any], list[Any]]:
        entries = list(meta.output_token_logprobs or [])
        tops = list(meta.output_top_logprobs or [])
        new_entries, new_tops = entries[self.sent :], tops[self.sent :]
        self.sent = len(entries)
        return new_entries, new_tops
