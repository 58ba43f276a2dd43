"""Chat messages -> prompt token ids with the tokenizer's chat template, or the template given
by `--chat-template` (a Jinja file, or Jinja text)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from radixserve.entrypoints.openai.errors import ApiError, scrub
from radixserve.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage

logger = logging.getLogger(__name__)


def load_chat_template(value: str | None) -> str | None:
    """The Jinja text of `--chat-template`; raises ValueError naming the option when unusable."""
    if value is None or value == "":
        return None
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text(encoding="utf-8")
    if "{{" in value or "{%" in value:
        return value  # inline Jinja
    raise ValueError(
        f"--chat-template {value!r} is neither a readable file nor a Jinja template; named "
        "templates are not supported, pass a Jinja file."
    )


def _content_text(msg: ChatMessage, index: int) -> str | None:
    if msg.content is None or isinstance(msg.content, str):
        return msg.content
    texts = []
    for j, part in enumerate(msg.content):
        if part.type not in ("text", "input_text"):
            raise ApiError(
                400,
                f"Content parts of type {part.type!r} are not supported by this model "
                "(it reads text only).",
                param=f"messages[{index}].content[{j}].type",
            )
        texts.append(part.text or "")
    return "".join(texts)


def to_template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    out = []
    for i, msg in enumerate(messages):
        item: dict[str, Any] = {"role": msg.role, "content": _content_text(msg, i)}
        for key in ("name", "tool_calls", "tool_call_id", "reasoning_content"):
            value = getattr(msg, key)
            if value is not None:
                item[key] = value
        out.append(item)
    return out


def render_chat(tokenizer: Any, req: ChatCompletionRequest, template: str | None) -> list[int]:
    """Prompt token ids for a chat request."""
    messages = to_template_messages(req.messages)
    continue_final = bool(req.continue_final_message)
    if continue_final and messages[-1]["role"] != "assistant":
        raise ApiError(
            400,
            "continue_final_message needs the last message to be from the assistant.",
            param="continue_final_message",
        )
    if template is None and not getattr(tokenizer, "chat_template", None):
        raise ApiError(
            400,
            "The model's tokenizer has no chat template; start the server with --chat-template.",
            param="messages",
        )
    kwargs: dict[str, Any] = dict(req.chat_template_kwargs or {})
    if req.tools:
        kwargs["tools"] = req.tools
    if template is not None:
        kwargs["chat_template"] = template
    try:
        text = tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=not continue_final,
            continue_final_message=continue_final,
            **kwargs,
        )
    except ApiError:
        raise
    except Exception as exc:  # template errors (e.g. a role the template refuses) are input errors
        logger.info("Chat template failed: %s", exc)
        raise ApiError(
            400,
            f"The chat template could not render these messages: {scrub(str(exc))}",
            param="messages",
        ) from exc
    # The template writes special tokens (BOS included) itself, so none are added here.
    return list(tokenizer.encode(text, add_special_tokens=False))
