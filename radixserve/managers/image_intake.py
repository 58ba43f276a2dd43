"""A request's images as it reaches the scheduler: refused for a text-only model or inside a
session, else processed to pixels (multimodal/image_items.py) and keyed in the prefix cache by
their content (multimodal/image_prompt.py), each refusal a message for a 400 of its own."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from radixserve.errors import InvalidRequestError
from radixserve.multimodal.image_prompt import ImagePrompt, keyed_ids

if TYPE_CHECKING:
    from radixserve.managers.schedule_batch import Req
    from radixserve.messages import TokenizedGenerateReq
    from radixserve.multimodal.image_items import ImagePreprocessor


def image_prompt(model: Any) -> ImagePrompt | None:
    """A vision model's placeholder (one with an `image_token_id`), else None: what the API
    side expands (it travels in SchedulerReady)."""
    token_id = getattr(model, "image_token_id", None)
    if token_id is None:
        return None
    return ImagePrompt(int(token_id), int(model.tokens_per_image))


def image_preprocessor(runner: Any) -> ImagePreprocessor | None:
    """The image processor of a vision model, else None."""
    from radixserve.multimodal.image_items import ImagePreprocessor

    model = getattr(runner, "model", None)
    if image_prompt(model) is None:
        return None
    return ImagePreprocessor(runner.model_dir, model.image_size)


TEXT_ONLY_MODEL = "This model reads text only; the request carries images."


def attach_images(
    req: Req, msg: TokenizedGenerateReq, preprocessor: ImagePreprocessor | None
) -> str | None:
    """Give `req` its images and image-keyed cache key; the reason it cannot, or None."""
    if not msg.images:
        return None
    if preprocessor is None:
        return TEXT_ONLY_MODEL
    if msg.session_params is not None:
        return "Images are not supported in session requests."
    for image in msg.images:
        if image.offset < 0 or image.offset + image.length > len(req.origin_input_ids):
            return "An image's placeholder tokens lie outside the prompt."
    try:
        req.images = preprocessor.prepare(msg.images)
    except InvalidRequestError as exc:
        return str(exc)
    spans = [(im.offset, im.length, im.hash) for im in req.images]
    req.origin_key_ids = keyed_ids(req.origin_input_ids, spans)
    return None
