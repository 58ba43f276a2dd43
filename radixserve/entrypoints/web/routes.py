"""The web UI's routes, left out of /openapi.json: they are pages, not API."""

from __future__ import annotations

from fastapi import APIRouter

from radixserve.entrypoints.web.pages import dashboard, playground
from radixserve.entrypoints.web.state import dashboard_state


def build_router() -> APIRouter:
    router = APIRouter()
    router.add_api_route("/playground", playground, methods=["GET"], include_in_schema=False)
    router.add_api_route("/dashboard", dashboard, methods=["GET"], include_in_schema=False)
    router.add_api_route(
        "/dashboard/state", dashboard_state, methods=["GET"], include_in_schema=False
    )
    return router
