"""POST /v1/completions."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from radixserve.entrypoints.bootstrap_fields import bootstrap_per_prompt
from radixserve.entrypoints.generation import GenItem, LogprobOptions, sample_copies
from radixserve.entrypoints.openai.common import (
    LogprobCursor,
    LogprobFormatter,
    finish_of,
    include_usage,
    new_id,
    now_s,
    usage_of,
    with_sgl_ext,
)
from radixserve.entrypoints.openai.errors import ApiError
from radixserve.entrypoints.openai.execute import start_generation
from radixserve.entrypoints.openai.lora_model import resolve_model_and_adapter
from radixserve.entrypoints.openai.protocol import CompletionRequest
from radixserve.entrypoints.openai.sampling import (
    COMPLETION_PARAM_NAMES,
    completion_sampling_params,
)
from radixserve.entrypoints.request_body import read_model
from radixserve.entrypoints.serving_context import ServingContext, get_ctx
from radixserve.entrypoints.sse import streaming_response
from radixserve.managers.outputs import GenerateOutput, MetaInfo

logger = logging.getLogger(__name__)


@dataclass
class _Plan:
    """A validated request: one GenItem per prompt and sample, prompt-major."""

    req: CompletionRequest
    rid: str
    items: list[GenItem]
    echo_texts: list[str]
    opts: LogprobOptions


def _prompts(req: CompletionRequest) -> tuple[list[str] | None, list[list[int]] | None]:
    prompt = req.prompt
    if isinstance(prompt, str):
        return [prompt], None
    if not prompt:
        raise ApiError(400, "prompt must not be empty.", param="prompt")
    if all(isinstance(p, str) for p in prompt):
        return list(prompt), None  # type: ignore[arg-type]
    if all(isinstance(p, int) for p in prompt):
        return None, [list(prompt)]  # type: ignore[arg-type]
    return None, [list(p) for p in prompt]  # type: ignore[union-attr]


def _item_rids(base: str, user_rid: str | list[str] | None, count: int) -> list[str]:
    if isinstance(user_rid, list):
        if len(user_rid) != count:
            raise ApiError(
                400, f"rid has {len(user_rid)} entries for {count} choices.", param="rid"
            )
        return list(user_rid)
    if isinstance(user_rid, str) and user_rid:
        return [user_rid] if count == 1 else [f"{user_rid}-{k}" for k in range(count)]
    return [f"{base}-{k}" for k in range(count)]


def plan_completion(ctx: ServingContext, req: CompletionRequest) -> _Plan:
    adapter = resolve_model_and_adapter(ctx, req.model, req.lora_path)
    texts, ids_list = _prompts(req)
    params = completion_sampling_params(req)
    rid = new_id("cmpl")
    count = len(texts or ids_list or []) * req.n
    rids = _item_rids(rid, req.rid, count)
    items: list[GenItem] = []
    echo_texts: list[str] = []
    num_prompts = count // req.n
    if isinstance(adapter, list) and len(adapter) != num_prompts:
        raise ApiError(
            400,
            f"lora_path has {len(adapter)} entries for {num_prompts} prompts.",
            param="lora_path",
        )
    rooms = bootstrap_per_prompt(
        req.bootstrap_host, req.bootstrap_port, req.bootstrap_room, num_prompts
    )
    for i in range(num_prompts):
        text = texts[i] if texts is not None else None
        ids = ids_list[i] if ids_list is not None else None
        if req.echo and text is not None:
            echo_texts.append(text)
        elif req.echo:
            echo_texts.append(ctx.require_tokenizer("echo of token ids").decode(ids or []))
        item = GenItem(
            dict(params),
            text,
            ids,
            lora_path=adapter[i] if isinstance(adapter, list) else adapter,
            priority=req.priority,
            return_routed_experts=req.return_routed_experts,
            routed_experts_start_len=req.routed_experts_start_len,
            bootstrap=rooms[i],
        )
        items.extend(sample_copies(item, rids[len(items) : len(items) + req.n]))
    want_logprobs = req.logprobs is not None
    opts = LogprobOptions(
        return_logprob=want_logprobs,
        logprob_start_len=0 if (want_logprobs and req.echo) else None,
        top_logprobs_num=req.logprobs or 0,
    )
    return _Plan(req, rid, items, echo_texts, opts)


def _input_logprobs(meta: MetaInfo) -> tuple[list[Any], list[Any]]:
    """Prompt logprobs (echo) with their top lists padded to the same length."""
    entries = list(meta.input_token_logprobs or [])
    tops = list(meta.input_top_logprobs or [])[: len(entries)]
    return entries, tops + [None] * (len(entries) - len(tops))


def _logprobs(fmt: LogprobFormatter, meta: MetaInfo, with_input: bool) -> dict[str, Any]:
    entries, tops = _input_logprobs(meta) if with_input else ([], [])
    entries += list(meta.output_token_logprobs or [])
    tops += list(meta.output_top_logprobs or [])
    return fmt.completion(entries, tops, 0)


def _response(ctx: ServingContext, plan: _Plan, results: Sequence[GenerateOutput]) -> dict:
    fmt = LogprobFormatter(ctx.decode_token)
    choices = []
    metas = [r.meta_info for r in results]
    for k, (res, meta) in enumerate(zip(results, metas, strict=True)):
        finish = finish_of(meta)
        prefix = plan.echo_texts[k // plan.req.n] if plan.req.echo else ""
        logprobs = None
        if plan.opts.return_logprob:
            logprobs = _logprobs(fmt, meta, plan.req.echo)
        choice = {
            "index": k,
            "text": prefix + (res.text or ""),
            "logprobs": logprobs,
            "finish_reason": finish.reason,
            "matched_stop": finish.matched,
        }
        choices.append(with_sgl_ext(choice, meta, plan.req))
    return {
        "id": plan.rid,
        "object": "text_completion",
        "created": now_s(),
        "model": ctx.model_name,
        "choices": choices,
        "usage": usage_of(metas, plan.req.n, ctx.config.enable_cache_report),
    }


async def _stream_chunks(
    ctx: ServingContext, plan: _Plan, streams: list[AsyncIterator[GenerateOutput]]
) -> AsyncIterator[dict[str, Any]]:
    fmt = LogprobFormatter(ctx.decode_token)
    created = now_s()
    count = len(plan.items)
    cursors = [LogprobCursor() for _ in range(count)]
    offsets = [0] * count
    started = [False] * count
    metas: list[MetaInfo | None] = [None] * count
    async for idx, chunk in ctx.runner.merge(streams):
        meta = chunk.meta_info
        finish = finish_of(meta)
        text = chunk.text or ""
        first = not started[idx]
        started[idx] = True
        if first and plan.req.echo:
            text = plan.echo_texts[idx // plan.req.n] + text
        logprobs = None
        if plan.opts.return_logprob:
            entries, tops = cursors[idx].take(meta)
            if first and plan.req.echo:
                in_entries, in_tops = _input_logprobs(meta)
                entries, tops = in_entries + entries, in_tops + tops
            if entries:
                logprobs = fmt.completion(entries, tops, offsets[idx])
                offsets[idx] += sum(len(t) for t in logprobs["tokens"])
        if finish.reason is not None:
            metas[idx] = meta
        if not text and logprobs is None and finish.reason is None:
            continue
        choice = {
            "index": idx,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": finish.reason,
            "matched_stop": finish.matched,
        }
        with_sgl_ext(choice, meta, plan.req)
        yield {
            "id": plan.rid,
            "object": "text_completion",
            "created": created,
            "model": ctx.model_name,
            "choices": [choice],
        }
    usage = usage_of(metas, plan.req.n, ctx.config.enable_cache_report)
    if include_usage(ctx, plan.req.stream_options):
        yield {
            "id": plan.rid,
            "object": "text_completion",
            "created": created,
            "model": ctx.model_name,
            "choices": [],
            "usage": usage,
        }
    ctx.request_log.finished("/v1/completions", plan.rid, None, usage)


async def create_completion(request: Request) -> Response:
    ctx = get_ctx(request)
    req = await read_model(request, CompletionRequest)
    plan = plan_completion(ctx, req)
    ctx.request_log.received("/v1/completions", plan.rid, req.prompt, plan.items[0].sampling_params)
    started = await start_generation(
        ctx,
        request,
        plan.items,
        plan.opts,
        stream=req.stream,
        param_names=COMPLETION_PARAM_NAMES,
    )
    if started.streams is not None:
        return streaming_response(
            _stream_chunks(ctx, plan, started.streams), on_close=started.ticket.release
        )
    body = _response(ctx, plan, started.results or [])
    ctx.request_log.finished("/v1/completions", plan.rid, body["choices"], body["usage"])
    return JSONResponse(body)
