"""A request's images as it reaches the scheduler: refused for a text-only model or inside a
session, else processed to pixels (multimodal/image_items.py) and keyed in the prefix cache by
their content (multimodal/image_prompt.py), each refusal a message for a 400 of its own."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from radixserve.errors import InvalidRequestError
from radixserve.managers.background_work import BackgroundQueue
from radixserve.multimodal.image_prompt import LAYOUTS, ImagePrompt, keyed_ids
from radixserve.multimodal.mrope_positions import GridSpan, mrope_positions

if TYPE_CHECKING:
    from radixserve.managers.schedule_batch import Req
    from radixserve.messages import TokenizedGenerateReq
    from radixserve.multimodal.image_items import ImageItem, ImagePreprocessor

logger = logging.getLogger(__name__)


def image_prompt(model: Any, tokenizer: Any = None) -> ImagePrompt | None:
    """A vision model's placeholder (one with an `image_token_id`), else None: what the API
    side expands (it travels in SchedulerReady). A model with an `image_frame` (Gemma 3: what
    its processor writes before and after an image's feature tokens, token ids and text) has
    its text tokenized here."""
    token_id = getattr(model, "image_token_id", None)
    if token_id is None:
        return None
    # "tiles": the model folder's processor expands each image (Idefics3, SmolVLM); "grid":
    # it picks each image's resolution, so its token count (Qwen2-VL, Qwen2.5-VL).
    layout = str(getattr(model, "image_layout", "fixed"))
    if layout not in LAYOUTS:
        raise ValueError(f"image layout {layout!r} is not one of {LAYOUTS}")
    frame = getattr(model, "image_frame", None)
    if frame is None:
        anyres_max = getattr(model, "anyres_max", None)
        return ImagePrompt(
            int(token_id), int(model.tokens_per_image), layout, anyres_max=anyres_max
        )
    if tokenizer is None:
        # --skip-tokenizer-init: prompts come as ids, best expanded as the processor writes them.
        logger.warning(
            "Without a tokenizer the text around each image (%s) is not written when a "
            "prompt's image placeholder is expanded",
            frame,
        )
        frame = tuple(tuple(p for p in parts if not isinstance(p, str)) for parts in frame)
    before, after = (_frame_ids(tokenizer, parts) for parts in frame)
    return ImagePrompt(
        int(model.image_placeholder_id),
        int(model.tokens_per_image),
        layout,
        feature_token_id=int(token_id),
        before=before,
        after=after,
    )


def _frame_ids(tokenizer: Any, parts: Sequence[int | str]) -> tuple[int, ...]:
    ids: list[int] = []
    for part in parts:
        if isinstance(part, str):
            ids.extend(tokenizer.encode(part, add_special_tokens=False))
        else:
            ids.append(int(part))
    return tuple(ids)


def image_preprocessor(runner: Any) -> ImagePreprocessor | None:
    """The image processor of a vision model, else None."""
    from radixserve.multimodal.image_items import ImagePreprocessor

    model = getattr(runner, "model", None)
    token_id = getattr(model, "image_token_id", None)
    if token_id is None:
        return None
    # Processed on the API side: tiled (Idefics3, SmolVLM), cropped (LLaVA-OneVision / NeXT)
    # or sized to a patch grid (Qwen2-VL, Qwen2.5-VL).
    layout = getattr(model, "image_layout", "fixed")
    tiled = layout in ("tiles", "anyres")
    merge = int(getattr(model, "spatial_merge_size", 0)) if layout == "grid" else 0
    return ImagePreprocessor(runner.model_dir, model.image_size, int(token_id), tiled, merge)


TEXT_ONLY_MODEL = "This model reads text only; the request carries images."


def image_refusal(
    req: Req, msg: TokenizedGenerateReq, preprocessor: ImagePreprocessor | None
) -> str | None:
    """Why `req`'s images cannot be served, or None: what is known before processing them."""
    if not msg.images:
        return None
    if preprocessor is None:
        return TEXT_ONLY_MODEL
    if msg.session_params is not None:
        return "Images are not supported in session requests."
    for image in msg.images:
        if image.offset < 0 or image.offset + image.length > len(req.origin_input_ids):
            return "An image's placeholder tokens lie outside the prompt."
    return None


def _apply(req: Req, items: list[ImageItem], merge_size: int = 0) -> None:
    req.images = items
    spans = [(im.offset, im.length, im.hash) for im in items]
    req.origin_key_ids = keyed_ids(req.origin_input_ids, spans)
    if merge_size:
        # M-RoPE: the whole prompt's positions, from its layout, once.
        grids = [
            GridSpan(
                im.offset,
                im.grid_thw[0],
                im.grid_thw[1] // merge_size,
                im.grid_thw[2] // merge_size,
            )
            for im in items
            if im.grid_thw is not None
        ]
        req.mrope = mrope_positions(len(req.origin_input_ids), grids)


class ImageIntake:
    """Requests whose images are being processed to pixels (resize, normalize: tens of ms per
    image, more for a large one) on a worker thread, waiting in a BackgroundQueue as a
    compiling grammar waits in its own."""

    def __init__(self, preprocessor: ImagePreprocessor | None) -> None:
        self.preprocessor = preprocessor
        self.preparing: BackgroundQueue[list[ImageItem]] = BackgroundQueue((InvalidRequestError,))
        self._pool: ThreadPoolExecutor | None = None

    def refusal(self, req: Req, msg: TokenizedGenerateReq) -> str | None:
        return image_refusal(req, msg, self.preprocessor)

    def start(self, req: Req, msg: TokenizedGenerateReq) -> None:
        """Process `msg`'s images (already checked by refusal) in the background."""
        assert self.preprocessor is not None and msg.images
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="image-intake")
        self.preparing.add(req, self._pool.submit(self.preprocessor.prepare, msg.images))

    def collect_ready(self) -> tuple[list[Req], list[tuple[Req, str]]]:
        """Requests whose images are processed (given their images and cache key), and the
        ones whose images failed, with the reason."""
        preprocessor = self.preprocessor

        def apply(req: Req, items: list[ImageItem]) -> None:
            if preprocessor is not None:
                preprocessor.place_tiled(items, req.origin_input_ids)
            _apply(req, items, 0 if preprocessor is None else preprocessor.merge_size)

        return self.preparing.collect(apply)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
