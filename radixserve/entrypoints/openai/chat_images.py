"""Image content parts of chat messages (`{"type": "image_url", "image_url": {"url": ...}}`):
the images a vision model's request carries, in the order the chat template writes their
placeholders, and the names of the parts, for 400s that point at the client's field."""

from __future__ import annotations

from typing import Any, NamedTuple

from radixserve.entrypoints.openai.errors import ApiError
from radixserve.entrypoints.openai.protocol import ChatMessage, ContentPart

IMAGE_PART_TYPES = ("image_url", "input_image")


class ChatImages(NamedTuple):
    sources: list[str]  # each image as image_data takes it (a data URL or a path)
    # The engine's parameter (image_data[k]) -> the part it came from.
    param_names: dict[str, str]


def is_image_part(part: ContentPart) -> bool:
    return part.type in IMAGE_PART_TYPES


def image_url(part: ContentPart, param: str) -> str:
    """The URL of an image part: `image_url` as {"url": ...} or a string (the Responses
    API's input_image has `image_url` as a string)."""
    value: Any = (part.model_extra or {}).get("image_url")
    if isinstance(value, dict):
        value = value.get("url")
    if not isinstance(value, str) or not value:
        raise ApiError(400, "An image part needs image_url.url (a string).", param=param)
    return value


def chat_images(messages: list[ChatMessage]) -> ChatImages:
    sources: list[str] = []
    names: dict[str, str] = {}
    for i, msg in enumerate(messages):
        if msg.content is None or isinstance(msg.content, str):
            continue
        for j, part in enumerate(msg.content):
            if is_image_part(part):
                param = f"messages[{i}].content[{j}].image_url"
                names[f"image_data[{len(sources)}]"] = param
                sources.append(image_url(part, param))
    return ChatImages(sources, names)
