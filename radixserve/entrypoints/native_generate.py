"""POST /generate: SGLang's native generation route.

Text or input_ids, one or a batch; `sampling_params.n` samples per prompt (results prompt-major,
as SGLang). Streaming sends SGLang's cumulative text (or deltas with
--incremental-streaming-output) as SSE, with an "index" per chunk for batches.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from radixserve.entrypoints.bootstrap_fields import bootstrap_per_prompt
from radixserve.entrypoints.generation import GenItem, LogprobOptions, sample_copies, sample_rids
from radixserve.entrypoints.openai.common import finish_of
from radixserve.entrypoints.openai.errors import ApiError
from radixserve.entrypoints.openai.execute import start_generation
from radixserve.entrypoints.openai.protocol import GenerateReqInput
from radixserve.entrypoints.request_body import read_model
from radixserve.entrypoints.serving_context import ServingContext, get_ctx
from radixserve.entrypoints.sse import streaming_response
from radixserve.errors import InvalidRequestError
from radixserve.managers.outputs import GenerateOutput, LogprobEntry, MetaInfo, TopEntries
from radixserve.multimodal.request_images import per_prompt_images
from radixserve.sampling.sampling_params import MAX_N

logger = logging.getLogger(__name__)
ROUTE = "/generate"


@dataclass
class _Plan:
    req: GenerateReqInput
    items: list[GenItem]
    single: bool  # one prompt, n == 1, not given as a list: answer a dict, not a list
    opts: LogprobOptions


def _pop_n(params: dict[str, Any], where: str) -> int:
    n = params.pop("n", 1)
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise ApiError(400, f"n must be an integer in [1, {MAX_N}], got {n!r}.", param=where)
    return n


def plan_generate(req: GenerateReqInput) -> _Plan:
    if req.text is not None:
        prompts: list[Any] = [req.text] if isinstance(req.text, str) else list(req.text)
        batch = not isinstance(req.text, str)
    else:
        ids = req.input_ids or []
        batch = bool(ids) and isinstance(ids[0], list)
        prompts = list(ids) if batch else [ids]
    if not prompts:
        raise ApiError(
            400, "The batch is empty.", param="text" if req.text is not None else "input_ids"
        )
    params_list = _per_prompt(req.sampling_params, len(prompts), "sampling_params")
    rids = _per_prompt(req.rid, len(prompts), "rid")
    loras = _per_prompt(req.lora_path, len(prompts), "lora_path")
    sessions = _per_prompt(req.session_params, len(prompts), "session_params")
    processors = _per_prompt(req.custom_logit_processor, len(prompts), "custom_logit_processor")
    rooms = bootstrap_per_prompt(
        req.bootstrap_host, req.bootstrap_port, req.bootstrap_room, len(prompts)
    )
    try:
        images = per_prompt_images(req.image_data, len(prompts))
    except InvalidRequestError as exc:
        raise ApiError(400, str(exc), param="image_data") from exc
    items: list[GenItem] = []
    total_n = 0
    for i, prompt in enumerate(prompts):
        params = dict(params_list[i] or {})
        n = _pop_n(params, "sampling_params.n" if not batch else f"sampling_params[{i}].n")
        total_n += n
        text, ids = (prompt, None) if req.text is not None else (None, prompt)
        item = GenItem(
            params,
            text,
            ids,
            lora_path=loras[i],
            priority=req.priority,
            session_params=sessions[i],
            custom_logit_processor=processors[i],
            return_routed_experts=req.return_routed_experts,
            routed_experts_start_len=req.routed_experts_start_len,
            image_data=images[i],
            bootstrap=rooms[i],
        )
        items.extend(sample_copies(item, sample_rids(uuid.uuid4().hex, n, rids[i])))
    seen: set[str] = set()
    for it in items:
        if it.rid in seen:
            raise ApiError(400, f"Duplicate request id {it.rid!r} in the batch.", param="rid")
        seen.add(it.rid)
    opts = LogprobOptions(
        req.return_logprob, req.logprob_start_len, req.top_logprobs_num, req.token_ids_logprob
    )
    return _Plan(req, items, single=not batch and total_n == 1, opts=opts)


def _per_prompt(value: Any, count: int, name: str) -> list[Any]:
    if isinstance(value, list):
        if len(value) != count:
            raise ApiError(400, f"{name} has {len(value)} entries for {count} prompts.", param=name)
        return list(value)
    return [value] * count


def _with_token_text(ctx: ServingContext, meta: MetaInfo) -> MetaInfo:
    """return_text_in_logprobs: fill the text slot of each [logprob, id, text] entry (new
    lists: the request's own keep growing while it streams)."""

    def entries(values: list[LogprobEntry] | None) -> list[LogprobEntry] | None:
        if values is None:
            return None
        return [[e[0], e[1], ctx.decode_token(int(e[1]))] for e in values]

    def per_position(values: list[TopEntries] | None) -> list[TopEntries] | None:
        if values is None:
            return None
        return [entries(top) if top else top for top in values]

    return dataclasses.replace(
        meta,
        output_token_logprobs=entries(meta.output_token_logprobs),
        input_token_logprobs=entries(meta.input_token_logprobs),
        output_top_logprobs=per_position(meta.output_top_logprobs),
        input_top_logprobs=per_position(meta.input_top_logprobs),
        output_token_ids_logprobs=per_position(meta.output_token_ids_logprobs),
        input_token_ids_logprobs=per_position(meta.input_token_ids_logprobs),
    )


def _shape(ctx: ServingContext, plan: _Plan, result: GenerateOutput) -> GenerateOutput:
    """The route's additions: the weight version, token texts in the logprobs when asked, and
    no text field under --skip-tokenizer-init (SGLang's answers have none then)."""
    meta = dataclasses.replace(result.meta_info, weight_version=ctx.config.weight_version)
    if plan.req.return_text_in_logprobs:
        meta = _with_token_text(ctx, meta)
    text = None if _token_ids_only(ctx) else result.text
    return dataclasses.replace(result, meta_info=meta, text=text)


def _token_ids_only(ctx: ServingContext) -> bool:
    return bool(getattr(ctx.server_args, "skip_tokenizer_init", False))


async def _stream(
    ctx: ServingContext, plan: _Plan, streams: list[AsyncIterator[GenerateOutput]]
) -> AsyncIterator[dict[str, Any]]:
    incremental = ctx.config.incremental_streaming_output
    texts = [""] * len(plan.items)
    ids: list[list[int]] = [[] for _ in plan.items]
    async for idx, chunk in ctx.runner.merge(streams):
        finish_of(chunk.meta_info)  # an abort with an error status ends the stream
        texts[idx] += chunk.text or ""
        ids[idx].extend(chunk.output_ids or [])
        if not incremental:  # SGLang's default: each chunk carries everything so far
            chunk = dataclasses.replace(chunk, text=texts[idx], output_ids=list(ids[idx]))
        out = _shape(ctx, plan, chunk).to_json()
        if not plan.single:
            out["index"] = idx
        yield out


async def generate(request: Request) -> Response:
    ctx = get_ctx(request)
    req = await read_model(request, GenerateReqInput)
    if req.image_data and not ctx.takes_images:
        raise ApiError(400, "This model reads text only; it takes no images.", param="image_data")
    plan = plan_generate(req)
    if ctx.request_log.enabled:
        inputs = req.text if req.text is not None else req.input_ids
        ctx.request_log.received(ROUTE, plan.items[0].rid, inputs, req.sampling_params)
    started = await start_generation(ctx, request, plan.items, plan.opts, stream=req.stream)
    if started.streams is not None:
        return streaming_response(
            _stream(ctx, plan, started.streams), on_close=started.ticket.release
        )
    results = [_shape(ctx, plan, r) for r in started.results or []]
    if plan.single:
        finish_of(results[0].meta_info)  # an abort with an error status becomes that error
    for res in results:
        ctx.request_log.finished(ROUTE, res.meta_info.id, res.text, _log_summary(res.meta_info))
    bodies = [res.to_json() for res in results]
    return JSONResponse(bodies[0] if plan.single else bodies)


def _log_summary(meta: MetaInfo) -> dict[str, Any]:
    reason = meta.finish_reason
    return {
        "prompt_tokens": meta.prompt_tokens,
        "completion_tokens": meta.completion_tokens,
        "cached_tokens": meta.cached_tokens,
        "finish_reason": reason.to_json() if reason is not None else None,
    }
