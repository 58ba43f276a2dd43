"""POST /v1/tokenize and /v1/detokenize (also served as /tokenize and /detokenize)."""

from __future__ import annotations

from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from radixserve.entrypoints.openai.chat_template import render_chat
from radixserve.entrypoints.openai.errors import ApiError
from radixserve.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from radixserve.entrypoints.request_body import read_model
from radixserve.entrypoints.serving_context import get_ctx


async def tokenize(request: Request) -> Response:
    ctx = get_ctx(request)
    req = await read_model(request, TokenizeRequest)
    ctx.check_model(req.model)
    tok = ctx.require_tokenizer("Tokenization")
    if (req.prompt is None) == (req.messages is None):
        raise ApiError(400, "Give either prompt or messages to tokenize.", param="prompt")
    if req.messages is not None:
        # The chat completion's own prompt: the template writes its special tokens itself.
        chat = ChatCompletionRequest.model_validate(
            {
                "messages": req.messages,
                "tools": req.tools,
                "continue_final_message": req.continue_final_message,
                "chat_template_kwargs": req.chat_template_kwargs,
            }
        )
        ids = render_chat(
            tok,
            chat,
            ctx.chat_template,
            allow_request_template=ctx.config.allow_request_chat_template,
            add_generation_prompt=req.add_generation_prompt,
        )
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": ctx.context_len})

    def encode(text: str) -> list[int]:
        return list(tok.encode(text, add_special_tokens=req.add_special_tokens))

    if isinstance(req.prompt, str):
        tokens: list[int] | list[list[int]] = encode(req.prompt)
        count: int | list[int] = len(tokens)
    else:
        tokens = [encode(p) for p in req.prompt]
        count = [len(t) for t in tokens]
    return JSONResponse({"tokens": tokens, "count": count, "max_model_len": ctx.context_len})


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
