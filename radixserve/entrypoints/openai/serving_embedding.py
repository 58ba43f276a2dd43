"""POST /v1/embeddings and the native POST /encode.

Both read the engine's typed results (`async_encode_outputs`); an engine without it answers
400 with a clear message (also with --is-embedding), after checking the body like any route.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from radixserve.entrypoints.openai.errors import ApiError, from_request_error
from radixserve.entrypoints.openai.protocol import EmbeddingRequest, EncodeReqInput
from radixserve.entrypoints.request_body import read_model
from radixserve.entrypoints.serving_context import ServingContext, get_ctx
from radixserve.errors import InvalidRequestError
from radixserve.managers.outputs import GenerateOutput

NOT_EMBEDDING = "This server does not serve an embedding model (start it with --is-embedding)."
NOT_IMPLEMENTED = "Embedding models are not supported by this engine yet."


def _encoder(ctx: ServingContext) -> Any:
    if not ctx.config.is_embedding:
        raise ApiError(400, NOT_EMBEDDING, param="model")
    encode = getattr(ctx.engine, "async_encode_outputs", None)
    if encode is None:
        raise ApiError(400, NOT_IMPLEMENTED, param="model")
    return encode


async def create_embedding(request: Request) -> Response:
    ctx = get_ctx(request)
    req = await read_model(request, EmbeddingRequest)
    ctx.check_model(req.model)
    encode = _encoder(ctx)
    inputs: Any = req.input
    key = (
        "prompt"
        if isinstance(inputs, str) or (inputs and isinstance(inputs[0], str))
        else ("input_ids")
    )
    try:
        results = await encode(**{key: inputs})
    except InvalidRequestError as exc:
        raise from_request_error(exc, {"text": "input", "input_ids": "input"}) from exc
    outputs: list[GenerateOutput] = results if isinstance(results, list) else [results]
    data = [
        {"object": "embedding", "index": i, "embedding": r.embedding} for i, r in enumerate(outputs)
    ]
    prompt_tokens = sum(r.meta_info.prompt_tokens for r in outputs)
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    return JSONResponse({"object": "list", "data": data, "model": ctx.model_name, "usage": usage})


async def encode(request: Request) -> Response:
    ctx = get_ctx(request)
    body = await read_model(request, EncodeReqInput)
    encoder = _encoder(ctx)
    try:
        result = await encoder(prompt=body.text, input_ids=body.input_ids, rid=body.rid)
    except InvalidRequestError as exc:
        raise from_request_error(exc) from exc
    if isinstance(result, list):  # a batch of prompts
        return JSONResponse([r.to_json() for r in result])
    return JSONResponse(result.to_json())
