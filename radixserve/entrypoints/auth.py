"""API-key checks with SGLang's three levels (`python/sglang/srt/utils/auth.py` semantics).

| level          | no keys | api_key only | admin_api_key only | both                      |
|----------------|---------|--------------|--------------------|---------------------------|
| normal         | allow   | api_key      | allow              | api_key                   |
| admin_optional | allow   | api_key      | admin key          | admin key (api_key fails) |

`OPTIONS` and paths under /health and /metrics are always open; so are the web UI's pages
(/playground, /dashboard, and / when a browser asks for HTML) while the UI is on: they hold no
data, and the key typed into them goes on their API calls. Keys are compared in constant time
and never logged.
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from radixserve.entrypoints.openai.errors import ApiError
from radixserve.entrypoints.web.pages import PAGE_PATHS, wants_html


class AuthLevel(enum.Enum):
    NORMAL = "normal"
    ADMIN_OPTIONAL = "admin_optional"


# Routes that change the server: SGLang marks these ADMIN_OPTIONAL.
ADMIN_ROUTES = frozenset(
    {
        "/flush_cache",
        "/abort_request",
        "/configure_logging",
        "/set_internal_state",
        "/start_profile",
        "/stop_profile",
        "/freeze_gc",
        "/update_weights_from_disk",
        "/get_weights_by_name",
        "/pause_generation",
        "/continue_generation",
        "/load_lora_adapter",
        "/unload_lora_adapter",
        "/release_memory_occupation",
        "/resume_memory_occupation",
        "/slow_down",
        "/start_expert_distribution_record",
        "/stop_expert_distribution_record",
        "/dump_expert_distribution_record",
    }
)
OPEN_PREFIXES = ("/health", "/metrics")


def route_level(path: str) -> AuthLevel:
    return AuthLevel.ADMIN_OPTIONAL if path.rstrip("/") in ADMIN_ROUTES else AuthLevel.NORMAL


def _matches(presented: str | None, key: str) -> bool:
    if presented is None:
        return False
    return secrets.compare_digest(presented.encode("utf-8"), key.encode("utf-8"))


def decide(
    path: str, method: str, bearer: str | None, api_key: str | None, admin_api_key: str | None
) -> bool:
    """True when the request may proceed."""
    if method == "OPTIONS" or path.startswith(OPEN_PREFIXES):
        return True
    if route_level(path) is AuthLevel.ADMIN_OPTIONAL and admin_api_key:
        return _matches(bearer, admin_api_key)
    if api_key:
        return _matches(bearer, api_key)
    return True


def _header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


def is_open_page(path: str, method: str, headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """A browser page of the web UI: loads without a key (a browser cannot add one to a
    navigation), while /dashboard/state and the API behind the pages still need it."""
    if method not in ("GET", "HEAD"):
        return False
    if path in PAGE_PATHS:
        return True
    return path == "/" and wants_html(_header(headers, b"accept"))


def bearer_token(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name == b"authorization":
            text = value.decode("latin-1").strip()
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return None
    return None


class ApiKeyMiddleware:
    """Pure ASGI, so it wraps streaming responses without buffering them."""

    def __init__(
        self,
        app: ASGIApp,
        api_key: str | None,
        admin_api_key: str | None,
        root_path: str = "",
        open_pages: bool = False,
    ) -> None:
        self.app = app
        self.open_pages = open_pages
        self.api_key = api_key
        self.admin_api_key = admin_api_key
        self.root_path = root_path.rstrip("/")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if self.root_path and path.startswith(self.root_path):
            path = path[len(self.root_path) :] or "/"
        headers = scope.get("headers", ())
        method = scope.get("method", "GET")
        if self.open_pages and is_open_page(path, method, headers):
            await self.app(scope, receive, send)
            return
        token = bearer_token(headers)
        if decide(path, method, token, self.api_key, self.admin_api_key):
            await self.app(scope, receive, send)
            return
        error = ApiError(
            401,
            "Unauthorized: a valid API key is required (Authorization: Bearer <key>).",
            headers={"WWW-Authenticate": "Bearer"},
        )
        await error.response()(scope, receive, send)
