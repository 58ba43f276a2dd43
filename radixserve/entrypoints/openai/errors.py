"""One error shape for every route: OpenAI's `{"error": {"message", "type", "param", "code"}}`.

Handlers raise `ApiError`, or let an `InvalidRequestError` (radixserve.errors: the one base of
every client error, carrying `.param`) escape to become a 400; the exception handlers installed
by `install_error_handlers` turn everything into that body. Any other exception, a ValueError
from a bug included, is an internal error: logged with a fresh error id, answered with a 500
whose body carries only that id. Bodies never carry a traceback or a host path.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixserve.errors import InvalidRequestError

logger = logging.getLogger(__name__)

# OpenAI's error `type` per status (the official clients map statuses to exception classes).
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}
# Absolute paths in exception messages would leak the host layout to clients.
_PATH_RE = re.compile(r"(?:[A-Za-z]:)?(?:/[\w.@+-]+){2,}/?")


class ApiError(Exception):
    """An HTTP error with OpenAI's body; `param` names the offending request field."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        param: str | None = None,
        err_type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.param = param
        self.err_type = err_type or error_type(status_code)
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.status_code, param=self.param, err_type=self.err_type)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code, headers=self.headers)


def error_type(status_code: int) -> str:
    if status_code in _TYPES:
        return _TYPES[status_code]
    return "invalid_request_error" if status_code < 500 else "internal_server_error"


def scrub(message: str) -> str:
    """Remove absolute file paths from a message meant for a client."""
    return _PATH_RE.sub("<path>", message)


def error_body(
    message: str, status_code: int, *, param: str | None = None, err_type: str | None = None
) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": err_type or error_type(status_code),
            "param": param,
            "code": status_code,
        }
    }


def from_request_error(
    exc: InvalidRequestError, param_names: Mapping[str, str] | None = None
) -> ApiError:
    """A 400 for a client error from the engine (`RequestError`, `SamplingParamsError`,
    `GrammarError`, ...), with the engine's parameter name mapped back to the client's."""
    param = exc.param
    message = scrub(str(exc)) or "Invalid request."
    if param_names and param in param_names:
        new = param_names[param]
        message = message.replace(param, new)
        param = new
    return ApiError(400, message, param=param)


def internal_error(exc: BaseException, context: str) -> ApiError:
    """A 500 for an unexpected exception: logged (with its traceback) under a fresh error id,
    which is all the client sees of it."""
    error_id = f"err-{uuid.uuid4().hex[:16]}"
    logger.error("Internal error %s %s", error_id, context, exc_info=exc)
    return ApiError(
        500,
        f"Internal server error (request id {error_id}).",
        headers={"X-Request-Id": error_id},
    )


def validation_error_to_api(exc: ValidationError | RequestValidationError) -> ApiError:
    """Pydantic errors become a 400 whose param is the first failing field's path."""
    errors = exc.errors()
    if not errors:
        return ApiError(400, "Invalid request body.")
    param = _field_path(errors[0].get("loc", ()))
    # A union field fails once per member type: report all of them for that one field.
    messages: list[str] = []
    for err in errors:
        if _field_path(err.get("loc", ())) == param:
            msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
            if msg not in messages:
                messages.append(msg)
    where = f"{param}: " if param else ""
    return ApiError(400, scrub(where + "; or ".join(messages)), param=param or None)


# Pydantic puts union member tags ("str", "list[int]", "ContentPart") into error locations.
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "none", "bytes"})


def _is_type_tag(part: str) -> bool:
    return "[" in part or part in _TYPE_TAGS or part[:1].isupper() or "-" in part


def _field_path(loc: Any) -> str:
    out = ""
    for part in loc:
        if part == "body":
            continue
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        if _is_type_tag(str(part)):
            break
        out += f".{part}" if out else str(part)
    return out


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _request_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error_to_api(exc).response()

    @app.exception_handler(ValidationError)
    async def _validation(_: Request, exc: ValidationError) -> JSONResponse:
        return validation_error_to_api(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else None
        message = detail or HTTPStatus(exc.status_code).phrase
        return ApiError(exc.status_code, message, headers=exc.headers).response()

    @app.exception_handler(InvalidRequestError)
    async def _invalid_request(_: Request, exc: InvalidRequestError) -> JSONResponse:
        return from_request_error(exc).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return internal_error(exc, f"on {request.method} {request.url.path}").response()
