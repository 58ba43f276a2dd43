"""Server-sent events: `data: {json}` events, `data: [DONE]` last, errors as events.

Once the first byte is out the status line is sent, so a failure mid-stream can only be told as
an SSE event `data: {"error": {...}}` followed by `data: [DONE]`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse

from radixserve.entrypoints.openai.errors import ApiError, from_request_error, internal_error
from radixserve.errors import InvalidRequestError

logger = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_event(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode("utf-8") + b"\n\n"


def error_event(exc: BaseException) -> bytes:
    if isinstance(exc, ApiError):
        return sse_event(exc.body())
    if isinstance(exc, InvalidRequestError):
        return sse_event(from_request_error(exc).body())
    return sse_event(internal_error(exc, "after a stream started").body())


async def sse_stream(
    chunks: AsyncIterator[Any], on_close: Callable[[], None] | None = None
) -> AsyncIterator[bytes]:
    """Encode `chunks` as events; end with [DONE] whether they finish or fail. `on_close`
    runs exactly once, also when the client goes away and the generator is closed."""
    try:
        try:
            async for chunk in chunks:
                yield sse_event(chunk)
        except Exception as exc:
            yield error_event(exc)  # logs anything that is not a client error
        yield DONE
    finally:
        # Release first: under a cancelled task group every later await raises again.
        if on_close is not None:
            on_close()
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


def streaming_response(
    chunks: AsyncIterator[Any], on_close: Callable[[], None] | None = None
) -> StreamingResponse:
    return StreamingResponse(
        sse_stream(chunks, on_close), media_type="text/event-stream", headers=SSE_HEADERS
    )
