"""POST /v1/chat/completions."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from radixserve.entrypoints.bootstrap_fields import bootstrap_per_prompt
from radixserve.entrypoints.generation import GenItem, LogprobOptions, sample_copies, sample_rids
from radixserve.entrypoints.openai.chat_images import ChatImages, chat_images
from radixserve.entrypoints.openai.chat_template import render_chat
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
from radixserve.entrypoints.openai.protocol import ChatCompletionRequest
from radixserve.entrypoints.openai.sampling import chat_param_names, chat_sampling_params
from radixserve.entrypoints.request_body import read_model
from radixserve.entrypoints.serving_context import ServingContext, get_ctx
from radixserve.entrypoints.sse import streaming_response
from radixserve.managers.outputs import GenerateOutput, MetaInfo
from radixserve.parsers.chat_output import ChoiceStream, OutputPlan, parse_choice, plan_output
from radixserve.parsers.tool_choice import ToolChoiceError

logger = logging.getLogger(__name__)
ROUTE = "/v1/chat/completions"


@dataclass
class ChatPlan:
    req: ChatCompletionRequest
    rid: str
    items: list[GenItem]
    opts: LogprobOptions
    output: OutputPlan
    # image_data[k] -> the message part it came from (400s name the client's field).
    image_params: dict[str, str] = field(default_factory=dict)


def _finish_reason(reason: str | None, made_tool_calls: bool) -> str | None:
    # SGLang reports a reply that ended normally with tool calls as "tool_calls".
    return "tool_calls" if made_tool_calls and reason == "stop" else reason


# SGLang's DeltaMessage fields, serialized on every delta (null when unset; only its
# hidden_states is dropped when empty): clients read delta.reasoning_content and friends
# without a default.
_DELTA_FIELDS = ("role", "content", "reasoning_content", "tool_calls")


def _with_null_fields(delta: dict[str, Any]) -> dict[str, Any]:
    return {**dict.fromkeys(_DELTA_FIELDS), **delta}


def _check_max_completion_tokens(ctx: ServingContext, req: ChatCompletionRequest) -> None:
    """A completion budget above the whole context can never be met: refuse it before
    tokenizing, in SGLang's words (clients match on "max_completion_tokens is too large";
    the missing space after the first period is SGLang's too)."""
    max_out = req.max_completion_tokens or req.max_tokens
    if max_out and max_out > ctx.context_len:
        raise ApiError(
            400,
            f"max_completion_tokens is too large: {max_out}."
            f"This model supports at most {ctx.context_len} completion tokens.",
            param="max_completion_tokens" if req.max_completion_tokens else "max_tokens",
        )


def plan_chat(
    ctx: ServingContext, req: ChatCompletionRequest, response_id: str | None = None
) -> ChatPlan:
    """Validate and tokenize a chat request; `response_id` names it (the Responses route
    passes its own `resp_...` id)."""
    if isinstance(req.lora_path, list):
        raise ApiError(400, "lora_path must be one adapter name for a chat.", param="lora_path")
    adapter = resolve_model_and_adapter(ctx, req.model, req.lora_path)
    _check_max_completion_tokens(ctx, req)
    params = chat_sampling_params(req)
    try:
        output = plan_output(ctx.server_args, req)
    except ToolChoiceError as exc:
        raise ApiError(400, str(exc), param=exc.param) from exc
    if output.needs_special_tokens:
        # gpt-oss's harmony markers are special tokens: skipping them would leave the parsers
        # nothing to split on (SGLang decodes with them for these parsers too).
        params["skip_special_tokens"] = False
    tokenizer = ctx.require_tokenizer("Chat completion")
    prompt_ids = render_chat(
        tokenizer,
        req,
        ctx.chat_template_for(tokenizer),
        allow_request_template=ctx.config.allow_request_chat_template,
        takes_images=ctx.takes_images,
    )
    images = chat_images(req.messages) if ctx.takes_images else ChatImages([], {})
    rid = response_id or new_id("chatcmpl")
    given = req.rid if isinstance(req.rid, str) and req.rid else None
    # Without a client rid every choice is `<response id>-<k>`, one choice included.
    rids = sample_rids(rid, req.n, given) if given else [f"{rid}-{k}" for k in range(req.n)]
    rooms = bootstrap_per_prompt(req.bootstrap_host, req.bootstrap_port, req.bootstrap_room, 1)
    item = GenItem(
        dict(params),
        None,
        list(prompt_ids),
        lora_path=adapter,
        priority=req.priority,
        return_routed_experts=req.return_routed_experts,
        routed_experts_start_len=req.routed_experts_start_len,
        image_data=list(images.sources) or None,
        bootstrap=rooms[0],
    )
    items = sample_copies(item, rids)
    opts = LogprobOptions(return_logprob=req.logprobs, top_logprobs_num=req.top_logprobs or 0)
    return ChatPlan(req, rid, items, opts, output, images.param_names)


def _response(ctx: ServingContext, plan: ChatPlan, results: Sequence[GenerateOutput]) -> dict:
    fmt = LogprobFormatter(ctx.decode_token)
    metas = [r.meta_info for r in results]
    choices = []
    for k, (res, meta) in enumerate(zip(results, metas, strict=True)):
        finish = finish_of(meta)
        logprobs = None
        if plan.opts.return_logprob:
            entries = meta.output_token_logprobs or []
            logprobs = {"content": fmt.chat(entries, meta.output_top_logprobs or [])}
        parsed = parse_choice(plan.output, res.text or "")
        message = {
            "role": "assistant",
            "content": parsed.content,
            "reasoning_content": parsed.reasoning,
            "tool_calls": parsed.tool_calls or None,
        }
        choice = {
            "index": k,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": _finish_reason(finish.reason, bool(parsed.tool_calls)),
            "matched_stop": None if parsed.tool_calls else finish.matched,
        }
        choices.append(with_sgl_ext(choice, meta, plan.req))
    return {
        "id": plan.rid,
        "object": "chat.completion",
        "created": now_s(),
        "model": ctx.model_name,
        "choices": choices,
        "usage": usage_of(metas, plan.req.n, ctx.config.enable_cache_report),
    }


def _chunk(plan: ChatPlan, ctx: ServingContext, created: int, choice: dict[str, Any]) -> dict:
    return {
        "id": plan.rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": ctx.model_name,
        "choices": [choice],
    }


def _delta(parser: ChoiceStream, text: str, final: bool) -> dict[str, Any]:
    out = parser.feed(text, final)
    delta: dict[str, Any] = {}
    if out.reasoning:
        delta["reasoning_content"] = out.reasoning
    if out.content:
        delta["content"] = out.content
    if out.tool_calls:
        delta["tool_calls"] = out.tool_calls
    return delta


async def _stream_chunks(
    ctx: ServingContext, plan: ChatPlan, streams: list[AsyncIterator[GenerateOutput]]
) -> AsyncIterator[dict[str, Any]]:
    fmt = LogprobFormatter(ctx.decode_token)
    created = now_s()
    count = len(plan.items)
    cursors = [LogprobCursor() for _ in range(count)]
    started = [False] * count
    parsers = [ChoiceStream(plan.output) for _ in range(count)]
    metas: list[MetaInfo | None] = [None] * count
    async for idx, chunk in ctx.runner.merge(streams):
        meta = chunk.meta_info
        finish = finish_of(meta)
        if not started[idx]:
            started[idx] = True
            role = {
                "index": idx,
                "delta": _with_null_fields({"role": "assistant", "content": ""}),
                "logprobs": None,
                "finish_reason": None,
            }
            yield _chunk(plan, ctx, created, role)
        text = chunk.text or ""
        logprobs = None
        if plan.opts.return_logprob:
            entries, tops = cursors[idx].take(meta)
            if entries:
                logprobs = {"content": fmt.chat(entries, tops)}
        if finish.reason is not None:
            metas[idx] = meta
        delta = _delta(parsers[idx], text, finish.reason is not None)
        if not delta and logprobs is None and finish.reason is None:
            continue
        delta = _with_null_fields(delta)
        made_calls = parsers[idx].made_tool_calls
        choice = {
            "index": idx,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": _finish_reason(finish.reason, made_calls),
            "matched_stop": None if made_calls else finish.matched,
        }
        yield _chunk(plan, ctx, created, with_sgl_ext(choice, meta, plan.req))
    usage = usage_of(metas, plan.req.n, ctx.config.enable_cache_report)
    if include_usage(ctx, plan.req.stream_options):
        yield {
            "id": plan.rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": ctx.model_name,
            "choices": [],
            "usage": usage,
        }
    ctx.request_log.finished(ROUTE, plan.rid, None, usage)


async def create_chat_completion(request: Request) -> Response:
    ctx = get_ctx(request)
    req = await read_model(request, ChatCompletionRequest)
    plan = plan_chat(ctx, req)
    if ctx.request_log.enabled:
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        ctx.request_log.received(ROUTE, plan.rid, messages, plan.items[0].sampling_params)
    started = await start_generation(
        ctx,
        request,
        plan.items,
        plan.opts,
        stream=req.stream,
        param_names=chat_param_names(req) | plan.image_params,
    )
    if started.streams is not None:
        return streaming_response(
            _stream_chunks(ctx, plan, started.streams), on_close=started.ticket.release
        )
    body = _response(ctx, plan, started.results or [])
    ctx.request_log.finished(ROUTE, plan.rid, body["choices"], body["usage"])
    return JSONResponse(body)
