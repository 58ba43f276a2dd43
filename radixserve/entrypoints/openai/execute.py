"""Admit a generation request, then run it (non-stream) or open its streams, mapping the
engine's client errors (InvalidRequestError) to 400s that name the client's field; anything
else reaches the app's handler as a 500. Shared by every generating route."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import NamedTuple

from starlette.requests import Request

from radixserve.entrypoints.generation import GenItem, LogprobOptions
from radixserve.entrypoints.http_state import Ticket
from radixserve.entrypoints.openai.errors import from_request_error
from radixserve.entrypoints.serving_context import ServingContext
from radixserve.errors import InvalidRequestError
from radixserve.managers.outputs import GenerateOutput


class Started(NamedTuple):
    results: list[GenerateOutput] | None
    streams: list[AsyncIterator[GenerateOutput]] | None
    ticket: Ticket


async def start_generation(
    ctx: ServingContext,
    request: Request,
    items: Sequence[GenItem],
    opts: LogprobOptions,
    *,
    stream: bool,
    param_names: Mapping[str, str] | None = None,
) -> Started:
    """Non-stream: the results, ticket already released. Stream: validated, unstarted streams;
    the caller releases the ticket when the response ends."""
    ticket = ctx.state.admit(len(items))
    try:
        if stream:
            streams = await ctx.runner.open_streams(items, opts)
            return Started(None, streams, ticket)
        results = await ctx.runner.run(request, items, opts)
    except InvalidRequestError as exc:
        ticket.release()
        raise from_request_error(exc, param_names) from exc
    except BaseException:
        ticket.release()
        raise
    ticket.release()
    return Started(results, None, ticket)
