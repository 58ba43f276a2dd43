"""Serving the two self-contained HTML pages shipped in static/ (package data: no CDN and no
build step, since the machines that run this are often offline)."""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi.responses import HTMLResponse
from starlette.requests import Request

PLAYGROUND = "playground.html"
DASHBOARD = "dashboard.html"
# The pages hold no secrets, so they load without a key; the key typed into a page is sent
# only on its API calls. Exact paths: /dashboard/state stays behind the key.
PAGE_PATHS = frozenset({"/playground", "/dashboard"})
# A page may call only its own server; inline script and style are how it ships.
CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'"
)


@cache
def page_text(name: str) -> str:
    return resources.files(__package__).joinpath("static", name).read_text(encoding="utf-8")


def wants_html(accept: str | None) -> bool:
    """Browsers navigating to a page ask for text/html first; curl and SDKs do not."""
    return bool(accept) and "text/html" in (accept or "").lower()


def page_response(name: str) -> HTMLResponse:
    return HTMLResponse(
        page_text(name),
        headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"},
    )


async def playground(_: Request) -> HTMLResponse:
    return page_response(PLAYGROUND)


async def dashboard(_: Request) -> HTMLResponse:
    return page_response(DASHBOARD)
