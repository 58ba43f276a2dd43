"""Reading request bodies: a size limit (413), content type (415), strict UTF-8 and JSON
(400), then pydantic validation (400 naming the field). Every failure is an `ApiError`."""

from __future__ import annotations

import json
import logging
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixserve.entrypoints.openai.errors import ApiError, validation_error_to_api

logger = logging.getLogger(__name__)

ModelT = TypeVar("ModelT", bound=BaseModel)


class BodyTooLarge(ApiError):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"The request body is larger than the limit of {limit} bytes.")


class BodyLimitMiddleware:
    """Refuses bodies over `limit` bytes: at once from Content-Length, or while reading a
    chunked body (the route's read then raises BodyTooLarge, which the handlers turn into 413)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            await BodyTooLarge(self.limit).response()(scope, receive, send)
            return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        await self.app(scope, limited_receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


async def read_json(request: Request, *, allow_empty: bool = False) -> Any:
    """The parsed JSON body; an empty body gives None when `allow_empty`."""
    content_type = request.headers.get("content-type", "")
    media = content_type.split(";", 1)[0].strip().lower()
    if media and media != "application/json" and not media.endswith("+json"):
        raise ApiError(
            415,
            f"Unsupported Content-Type {media!r}: only 'application/json' is accepted.",
            param="Content-Type",
        )
    raw = await request.body()
    if not raw.strip():
        if allow_empty:
            return None
        raise ApiError(400, "The request body is empty; a JSON object is required.")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"The request body is not valid UTF-8 (byte {exc.start}).") from exc
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except (json.JSONDecodeError, ValueError) as exc:
        raise ApiError(400, f"The request body is not valid JSON: {exc}.") from exc
    if b"\\ud" in raw.lower():  # only \uD800-\uDFFF escapes can make lone surrogates
        _check_surrogates(data)
    return data


def _check_surrogates(data: Any) -> None:
    # JSON escapes like "\ud800" decode to lone surrogates, which no tokenizer can encode.
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ApiError(
            400, "The request contains an invalid Unicode escape (a lone surrogate)."
        ) from exc


def parse_model(model: type[ModelT], data: Any) -> ModelT:
    if not isinstance(data, dict):
        raise ApiError(400, f"The request body must be a JSON object, got {type(data).__name__}.")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error_to_api(exc) from exc


async def read_model(request: Request, model: type[ModelT]) -> ModelT:
    return parse_model(model, await read_json(request))
