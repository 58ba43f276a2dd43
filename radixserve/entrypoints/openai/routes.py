"""The OpenAI-compatible routes under /v1."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from radixserve.entrypoints.openai.errors import ApiError
from radixserve.entrypoints.openai.lora_model import adapter_names
from radixserve.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
)
from radixserve.entrypoints.openai.responses_protocol import ResponsesRequest
from radixserve.entrypoints.openai.serving_chat import create_chat_completion
from radixserve.entrypoints.openai.serving_completions import create_completion
from radixserve.entrypoints.openai.serving_embedding import create_embedding
from radixserve.entrypoints.openai.serving_responses import (
    cancel_response,
    create_response,
    delete_response,
    retrieve_response,
)
from radixserve.entrypoints.openai.serving_tokenize import detokenize, tokenize
from radixserve.entrypoints.openapi_bodies import body_doc, tokenize_body_doc
from radixserve.entrypoints.serving_context import ServingContext, get_ctx


def _model_card(ctx: ServingContext) -> dict[str, Any]:
    return {
        "id": ctx.model_name,
        "object": "model",
        "created": int(ctx.state.started_at),
        "owned_by": "radixserve",
        "root": ctx.model_name,  # as SGLang: never the host path
        "max_model_len": ctx.context_len,
    }


def _adapter_card(ctx: ServingContext, name: str) -> dict[str, Any]:
    """A loaded LoRA adapter, as SGLang lists it (its root is its name, not a host path)."""
    return {**_model_card(ctx), "id": name, "root": name, "parent": ctx.model_name}


async def list_models(request: Request) -> Response:
    ctx = get_ctx(request)
    cards = [_model_card(ctx), *(_adapter_card(ctx, n) for n in adapter_names(ctx))]
    return JSONResponse({"object": "list", "data": cards})


async def retrieve_model(request: Request, model: str) -> Response:
    ctx = get_ctx(request)
    if model != ctx.model_name and model in adapter_names(ctx):
        return JSONResponse(_adapter_card(ctx, model))
    if model != ctx.model_name:
        raise ApiError(
            404, f"The model {model!r} does not exist.", param="model", err_type="not_found_error"
        )
    return JSONResponse(_model_card(ctx))


def build_router() -> APIRouter:
    router = APIRouter()
    router.add_api_route("/v1/models", list_models, methods=["GET"])
    router.add_api_route("/v1/models/{model:path}", retrieve_model, methods=["GET"])
    posts = (
        ("/v1/completions", create_completion, CompletionRequest),
        ("/v1/chat/completions", create_chat_completion, ChatCompletionRequest),
        ("/v1/responses", create_response, ResponsesRequest),
        ("/v1/embeddings", create_embedding, EmbeddingRequest),
        ("/v1/detokenize", detokenize, DetokenizeRequest),
    )
    for path, endpoint, body in posts:
        router.add_api_route(path, endpoint, methods=["POST"], openapi_extra=body_doc(body))
    # A prompt or chat messages: the schema says both forms.
    router.add_api_route(
        "/v1/tokenize", tokenize, methods=["POST"], openapi_extra=tokenize_body_doc()
    )
    router.add_api_route("/v1/responses/{response_id}", retrieve_response, methods=["GET"])
    router.add_api_route("/v1/responses/{response_id}", delete_response, methods=["DELETE"])
    router.add_api_route("/v1/responses/{response_id}/cancel", cancel_response, methods=["POST"])
    return router
