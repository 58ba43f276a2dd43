"""POST /v1/responses, GET/DELETE /v1/responses/{id}: OpenAI's Responses API served by the
chat completions machinery (responses_input.py maps the body onto a chat request)."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from radixserve.entrypoints.openai.common import finish_of
from radixserve.entrypoints.openai.errors import ApiError
from radixserve.entrypoints.openai.execute import start_generation
from radixserve.entrypoints.openai.responses_input import (
    input_messages,
    message_origins,
    output_messages,
    to_chat_request,
)
from radixserve.entrypoints.openai.responses_output import (
    new_response_id,
    output_items,
    response_object,
    status_of,
    usage_of,
)
from radixserve.entrypoints.openai.responses_protocol import ResponsesRequest
from radixserve.entrypoints.openai.responses_store import ResponseStore, StoredResponse
from radixserve.entrypoints.openai.responses_stream import (
    Event,
    ResponseEvents,
    event_stream_response,
)
from radixserve.entrypoints.openai.serving_chat import ChatPlan, plan_chat
from radixserve.entrypoints.request_body import read_model
from radixserve.entrypoints.serving_context import ServingContext, get_ctx
from radixserve.managers.outputs import GenerateOutput, MetaInfo
from radixserve.parsers.chat_output import ChoiceStream, parse_choice

ROUTE = "/v1/responses"
# Engine parameter names -> the Responses body's names, for error messages.
PARAM_NAMES = {
    "max_new_tokens": "max_output_tokens",
    "min_new_tokens": "min_tokens",
    "sampling_seed": "seed",
    "text": "input",
    "input_ids": "input",
}
# Chat request fields (named by errors the chat machinery raises) -> the Responses body's.
_CHAT_FIELDS = {
    "messages": "input",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "chat_template_kwargs": "reasoning.effort",
}


def get_store(request: Request) -> ResponseStore:
    """The app's store, made on first use (one per app; handlers run on one event loop)."""
    state = request.app.state
    store = getattr(state, "responses_store", None)
    if store is None:
        store = ResponseStore()
        state.responses_store = store
    return store


_MESSAGE = re.compile(r"^messages\[(\d+)\]")


def _origin_name(param: str, origins: Sequence[str]) -> str | None:
    """`messages[m]...` -> the Responses field message m came from, with the same tail
    (`input[2].content[1].image_url`); None when `param` names no message."""
    match = _MESSAGE.match(param)
    if match is None:
        return None
    m = int(match.group(1))
    if m >= len(origins):
        return None
    origin = origins[m]
    # Earlier turns and instructions are one field each: no tail (it would point into them).
    if origin in ("previous_response_id", "instructions"):
        return origin
    return origin + param[match.end() :]


def _renamed(exc: ApiError, origins: Sequence[str] = ()) -> ApiError:
    param = exc.param or ""
    named = _origin_name(param, origins)
    if named is not None:
        message = exc.message.replace(param, named)
        return ApiError(exc.status_code, message, param=named, err_type=exc.err_type)
    for chat_name, name in _CHAT_FIELDS.items():
        if param == chat_name or param.startswith((chat_name + ".", chat_name + "[")):
            message = exc.message.replace(chat_name, name)
            return ApiError(exc.status_code, message, param=name, err_type=exc.err_type)
    return exc


def _plan(ctx: ServingContext, req: ResponsesRequest, history: Sequence[dict]) -> ChatPlan:
    """The chat plan; its image_params name each image by the Responses field it came from,
    so that a bad image's 400 (raised when it is fetched and decoded) names the client's part."""
    # Raises, in the Responses body's terms, what to_chat_request would about the input.
    origins = message_origins(req, len(history), ctx.takes_images)
    try:
        plan = plan_chat(ctx, to_chat_request(req, history, ctx.takes_images), new_response_id())
    except ApiError as exc:
        raise _renamed(exc, origins) from exc
    plan.image_params = {
        key: _origin_name(param, origins) or param for key, param in plan.image_params.items()
    }
    return plan


def _history(store: ResponseStore, req: ResponsesRequest) -> tuple[dict[str, Any], ...]:
    if req.previous_response_id is None:
        return ()
    stored = store.get(req.previous_response_id)
    if stored is None:
        raise ApiError(
            404,
            f"Previous response with id {req.previous_response_id!r} not found (responses "
            "are kept in this server's memory only when created with store: true).",
            param="previous_response_id",
            err_type="not_found_error",
        )
    return stored.messages


def _keep(
    store: ResponseStore,
    req: ResponsesRequest,
    history: Sequence[dict[str, Any]],
    body: dict[str, Any],
    takes_images: bool,
) -> None:
    if not req.store:
        return
    # A later turn (previous_response_id) sees this turn's images again: they stay in the
    # stored messages as the client gave them (a URL is fetched again then).
    messages = (*history, *input_messages(req, takes_images), *output_messages(body["output"]))
    store.put(body["id"], StoredResponse(body, messages))


async def _events(
    ctx: ServingContext,
    plan: ChatPlan,
    req: ResponsesRequest,
    streams: list[AsyncIterator[GenerateOutput]],
    on_done: Any,
) -> AsyncIterator[Event]:
    created = int(time.time())
    emit = ResponseEvents()
    start = response_object(req, plan.rid, ctx.model_name, created_at=created)
    yield emit.event("response.created", response=start)
    yield emit.event("response.in_progress", response=start)
    parser = ChoiceStream(plan.output)
    meta: MetaInfo | None = None
    reason: str | None = None
    async for _, chunk in ctx.runner.merge(streams):
        meta = chunk.meta_info
        reason = finish_of(meta).reason
        out = parser.feed(chunk.text or "", reason is not None)
        for event in emit.text("reasoning", out.reasoning or ""):
            yield event
        for event in emit.text("message", out.content or ""):
            yield event
        for call in out.tool_calls:
            for event in emit.tool_call(call):
                yield event
    for event in emit.close():
        yield event
    status, details = status_of(reason)
    body = response_object(
        req,
        plan.rid,
        ctx.model_name,
        created_at=created,
        status=status,
        output=emit.output,
        incomplete_details=details,
        usage=usage_of(meta),
    )
    on_done(body)
    final = "response.completed" if status == "completed" else "response.incomplete"
    yield emit.event(final, response=body)


async def create_response(request: Request) -> Response:
    ctx = get_ctx(request)
    req = await read_model(request, ResponsesRequest)
    store = get_store(request)
    history = _history(store, req)
    plan = _plan(ctx, req, history)
    if ctx.request_log.enabled:
        ctx.request_log.received(ROUTE, plan.rid, req.input, plan.items[0].sampling_params)
    started = await start_generation(
        ctx,
        request,
        plan.items,
        plan.opts,
        stream=req.stream,
        param_names=PARAM_NAMES | plan.image_params,
    )

    def done(body: dict[str, Any]) -> None:
        _keep(store, req, history, body, ctx.takes_images)
        ctx.request_log.finished(ROUTE, plan.rid, body["output"], body["usage"])

    if started.streams is not None:
        events = _events(ctx, plan, req, started.streams, done)
        return event_stream_response(events, on_close=started.ticket.release)
    results = started.results or []
    meta = results[0].meta_info if results else None
    parsed = parse_choice(plan.output, (results[0].text if results else None) or "")
    status, details = status_of(finish_of(meta).reason if meta is not None else None)
    body = response_object(
        req,
        plan.rid,
        ctx.model_name,
        status=status,
        output=output_items(parsed.content, parsed.reasoning, parsed.tool_calls),
        incomplete_details=details,
        usage=usage_of(meta),
    )
    done(body)
    return JSONResponse(body)


def _not_found(response_id: str) -> ApiError:
    return ApiError(
        404,
        f"Response with id {response_id!r} not found (this server keeps responses in memory, "
        "only those created with store: true, and the most recent ones).",
        param="response_id",
        err_type="not_found_error",
    )


async def retrieve_response(request: Request, response_id: str) -> Response:
    stored = get_store(request).get(response_id)
    if stored is None:
        raise _not_found(response_id)
    return JSONResponse(stored.body)


async def delete_response(request: Request, response_id: str) -> Response:
    if not get_store(request).delete(response_id):
        raise _not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


async def cancel_response(request: Request, response_id: str) -> Response:
    if get_store(request).get(response_id) is None:
        raise _not_found(response_id)
    raise ApiError(
        400,
        "Only background responses can be cancelled; this server runs none (every response "
        "has finished by the time it is stored).",
        param="response_id",
    )
