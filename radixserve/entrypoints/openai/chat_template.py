"""Chat messages -> prompt token ids with the tokenizer's chat template, or the template given
by `--chat-template` (a Jinja file, or Jinja text)."""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any

from radixserve.entrypoints.openai.chat_images import is_image_part
from radixserve.entrypoints.openai.errors import ApiError, scrub
from radixserve.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    MessageToolCall,
)

logger = logging.getLogger(__name__)

# apply_chat_template arguments the server sets itself: a request may not pass them through
# chat_template_kwargs (tokenize=True, say, would hand token ids to the text path).
SERVER_OWNED_KWARGS = frozenset(
    {
        "conversation",
        "tokenize",
        "add_generation_prompt",
        "continue_final_message",
        "return_dict",
        "return_tensors",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        "padding",
        "truncation",
        "max_length",
    }
)


def folder_chat_template(model_dir: str | Path | None) -> str | None:
    """The chat template a model folder keeps beside its processor (chat_template.jinja, or
    chat_template.json's "chat_template", as LLaVA checkpoints ship it), or None."""
    if not model_dir:
        return None
    folder = Path(model_dir)
    with contextlib.suppress(OSError):
        return (folder / "chat_template.jinja").read_text(encoding="utf-8")
    with contextlib.suppress(OSError, ValueError, AttributeError):
        value = json.loads((folder / "chat_template.json").read_text(encoding="utf-8"))
        template = value.get("chat_template")
        return template if isinstance(template, str) else None
    return None


def load_chat_template(value: str | None) -> str | None:
    """The Jinja text of `--chat-template`; raises ValueError naming the option when unusable."""
    if value is None or value == "":
        return None
    path = Path(value).expanduser()
    try:
        is_file = path.is_file()
    except OSError:  # inline Jinja longer than a file name may be
        is_file = False
    if is_file:
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


def _content_parts(msg: ChatMessage, index: int) -> list[dict[str, Any]]:
    """A vision model's message content as transformers' processors hand it to their chat
    templates: a list of {"type": "text", "text"} and {"type": "image"} parts (a string
    content becomes one text part), whose image parts the template writes as placeholders."""
    if msg.content is None or isinstance(msg.content, str):
        return [{"type": "text", "text": msg.content or ""}]
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(msg.content):
        if is_image_part(part):
            parts.append({"type": "image"})
        elif part.type in ("text", "input_text"):
            parts.append({"type": "text", "text": part.text or ""})
        else:
            raise ApiError(
                400,
                f"Content parts of type {part.type!r} are not supported by this model "
                "(it reads text and images).",
                param=f"messages[{index}].content[{j}].type",
            )
    return parts


def _tool_calls_text(tool_calls: list[MessageToolCall]) -> str:
    """Earlier tool calls written back as the model emits them (the Hermes/Qwen style
    `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`), for templates that would
    otherwise drop them."""
    parts = []
    for call in tool_calls:
        arguments: Any = call.function.arguments
        if isinstance(arguments, str):
            # Not JSON: kept as the string the client sent.
            with contextlib.suppress(json.JSONDecodeError):
                arguments = json.loads(arguments)
        body = json.dumps({"name": call.function.name, "arguments": arguments})
        parts.append(f"<tool_call>\n{body}\n</tool_call>")
    return "\n".join(parts)


def to_template_messages(
    messages: list[ChatMessage], template: str | None = None, takes_images: bool = False
) -> list[dict[str, Any]]:
    """Messages as chat templates expect them. `content: null` (an assistant turn that only
    calls tools, as the openai client sends it) becomes "" (templates concatenate content);
    when the template does not render `tool_calls` itself, the calls are written into the
    content so the model still sees what it called."""
    renders_tool_calls = template is None or "tool_calls" in template
    out = []
    for i, msg in enumerate(messages):
        content: str | list[dict[str, Any]]
        if takes_images:
            content = _content_parts(msg, i)
            if msg.tool_calls and not renders_tool_calls:
                content.append({"type": "text", "text": _tool_calls_text(msg.tool_calls)})
        else:
            content = _content_text(msg, i) or ""
            if msg.tool_calls and not renders_tool_calls:
                calls = _tool_calls_text(msg.tool_calls)
                content = f"{content}\n{calls}" if content else calls
        item: dict[str, Any] = {"role": msg.role, "content": content}
        for key in ("name", "tool_call_id", "reasoning_content"):
            value = getattr(msg, key)
            if value is not None:
                item[key] = value
        if msg.tool_calls is not None:
            # The calls as the client sent them: templates index them as dicts.
            item["tool_calls"] = [c.model_dump(exclude_unset=True) for c in msg.tool_calls]
        out.append(item)
    return out


def _request_kwargs(req: ChatCompletionRequest, allow_request_template: bool) -> dict[str, Any]:
    """chat_template_kwargs, minus what a client may not set: the template itself (Jinja from
    the request runs only when the operator allows it) and the arguments the server owns."""
    kwargs: dict[str, Any] = dict(req.chat_template_kwargs or {})
    if "chat_template" in kwargs and not allow_request_template:
        raise ApiError(
            400,
            "A chat template may not be supplied with the request; the operator sets it with "
            "--chat-template.",
            param="chat_template_kwargs.chat_template",
        )
    owned = sorted(SERVER_OWNED_KWARGS.intersection(kwargs))
    if owned:
        raise ApiError(
            400,
            f"chat_template_kwargs may not set {owned[0]!r}: the server sets it.",
            param=f"chat_template_kwargs.{owned[0]}",
        )
    return kwargs


def render_chat(
    tokenizer: Any,
    req: ChatCompletionRequest,
    template: str | None,
    allow_request_template: bool = False,
    add_generation_prompt: bool = True,
    takes_images: bool = False,
) -> list[int]:
    """Prompt token ids for a chat request (`add_generation_prompt` False: /v1/tokenize's
    option to render the messages alone). `takes_images`: a vision model, whose messages reach
    the template as lists of parts, an image part written as the model's placeholder."""
    active = template if template is not None else getattr(tokenizer, "chat_template", None)
    messages = to_template_messages(
        req.messages, active if isinstance(active, str) else None, takes_images
    )
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
    kwargs = _request_kwargs(req, allow_request_template)
    if req.tools:
        kwargs["tools"] = req.tools
    if template is not None:
        kwargs["chat_template"] = template
    try:
        text = tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=add_generation_prompt and not continue_final,
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
