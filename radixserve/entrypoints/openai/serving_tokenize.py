"""POST /v1/tokenize and /v1/detokenize (also served as /tokenize and /detokenize)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from radixserve.entrypoints.openai.chat_images import chat_images
from radixserve.entrypoints.openai.chat_template import render_chat
from radixserve.entrypoints.openai.errors import ApiError
from radixserve.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from radixserve.entrypoints.request_body import parse_model, read_json, read_model
from radixserve.entrypoints.serving_context import ServingContext, get_ctx
from radixserve.errors import InvalidRequestError
from radixserve.multimodal.image_prompt import expand_placeholders


async def tokenize(request: Request) -> Response:
    ctx = get_ctx(request)
    body = await read_json(request)
    if isinstance(body, dict) and "messages" in body:
        # A tiling model's images are read and processed (off the event loop) for their counts.
        return await asyncio.to_thread(_tokenize_chat, ctx, body)
    req = parse_model(TokenizeRequest, body)
    ctx.check_model(req.model)
    tok = ctx.require_tokenizer("Tokenization")

    def encode(text: str) -> list[int]:
        return list(tok.encode(text, add_special_tokens=req.add_special_tokens))

    if isinstance(req.prompt, str):
        tokens: list[int] | list[list[int]] = encode(req.prompt)
        count: int | list[int] = len(tokens)
    else:
        tokens = [encode(p) for p in req.prompt]
        count = [len(t) for t in tokens]
    return JSONResponse({"tokens": tokens, "count": count, "max_model_len": ctx.context_len})


def _tokenize_chat(ctx: ServingContext, body: dict[str, Any]) -> Response:
    """Chat `messages`: the prompt a chat completion with these messages would run (chat
    template applied, tools and chat_template_kwargs included), as SGLang tokenizes it."""
    if "prompt" in body:
        raise ApiError(400, "Give either prompt or messages, not both.", param="messages")
    fields = dict(body)
    # The template writes the special tokens itself; add_special_tokens has nothing to add.
    fields.pop("add_special_tokens", None)
    add_generation_prompt = fields.pop("add_generation_prompt", True)
    if not isinstance(add_generation_prompt, bool):
        raise ApiError(
            400, "add_generation_prompt must be a boolean.", param="add_generation_prompt"
        )
    req = parse_model(ChatCompletionRequest, fields)
    ctx.check_model(req.model)
    tokenizer = ctx.require_tokenizer("Tokenization")
    tokens = render_chat(
        tokenizer,
        req,
        ctx.chat_template_for(tokenizer),
        allow_request_template=ctx.config.allow_request_chat_template,
        add_generation_prompt=add_generation_prompt,
        takes_images=ctx.takes_images,
    )
    if ctx.takes_images:
        # The tokens the model runs: each image's placeholder expanded (images not read,
        # unless the model's processor decides their counts: Idefics3, SmolVLM, Qwen2-VL).
        images = ctx.engine.tokenizer_manager.images
        sources = chat_images(req.messages).sources
        try:
            if images.sized_by_processor and sources:
                tokens, _ = images.expand(tokens, sources)
            else:
                tokens, _ = expand_placeholders(tokens, images.prompt, len(sources))
        except InvalidRequestError as exc:
            raise ApiError(400, str(exc), param="messages") from exc
    return JSONResponse({"tokens": tokens, "count": len(tokens), "max_model_len": ctx.context_len})


async def detokenize(request: Request) -> Response:
    ctx = get_ctx(request)
    req = await read_model(request, DetokenizeRequest)
    ctx.check_model(req.model)
    tok = ctx.require_tokenizer("Detokenization")
    batch = bool(req.tokens) and isinstance(req.tokens[0], list)
    seqs: list[list[int]] = req.tokens if batch else [req.tokens]  # type: ignore[assignment,list-item]
    for i, seq in enumerate(seqs):
        for tid in seq:
            if not 0 <= tid < ctx.vocab_size:
                where = f"tokens[{i}]" if batch else "tokens"
                raise ApiError(
                    400,
                    f"Token id {tid} is outside the vocabulary [0, {ctx.vocab_size}).",
                    param=where,
                )
    texts = [tok.decode(seq, skip_special_tokens=req.skip_special_tokens) for seq in seqs]
    return JSONResponse({"text": texts if batch else texts[0]})
