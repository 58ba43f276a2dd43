"""What every route needs, built once per app and kept on `app.state.ctx`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from radixserve.entrypoints.generation import GenerationRunner
from radixserve.entrypoints.http_config import HttpConfig
from radixserve.entrypoints.http_state import ServerState
from radixserve.entrypoints.openai.errors import ApiError
from radixserve.entrypoints.request_log import RequestLogger
from radixserve.observability.metrics import ServingMetrics

logger = logging.getLogger(__name__)


@dataclass
class ServingContext:
    engine: Any
    server_args: Any
    config: HttpConfig
    state: ServerState
    runner: GenerationRunner
    metrics: ServingMetrics | None
    request_log: RequestLogger
    chat_template: str | None = None
    # Set by the server runner: asks the server to exit (the engine died).
    on_fatal: Callable[[], None] | None = None
    # Set once a request named another model (check_model logs that only the first time).
    _model_mismatch_logged: bool = False
    # A vision model's folder chat template, read once ("" when it has none).
    _folder_template: str | None = None

    @property
    def tokenizer(self) -> Any:
        return getattr(self.engine, "tokenizer", None)

    @property
    def model_config(self) -> Any:
        """vocab_size, context_len, architectures: the engine's `model_info` (what the
        scheduler reported when ready), or the in-process runner's model config."""
        info = getattr(self.engine, "model_info", None)
        if info is not None:
            return info
        return self.engine.runner.model_config

    @property
    def context_len(self) -> int:
        return int(self.model_config.context_len)

    @property
    def vocab_size(self) -> int:
        return int(self.model_config.vocab_size)

    @property
    def model_name(self) -> str:
        return self.config.served_model_name

    @property
    def takes_images(self) -> bool:
        """A vision model's server: chat image parts and /generate's image_data are read."""
        manager = getattr(self.engine, "tokenizer_manager", None)
        images = getattr(manager, "images", None)
        return bool(getattr(images, "accepted", False))

    def chat_template_for(self, tokenizer: Any) -> str | None:
        """--chat-template, else None (the tokenizer's own), but for a vision model whose
        tokenizer has none: the template beside its processor in the model folder."""
        if self.chat_template is not None or getattr(tokenizer, "chat_template", None):
            return self.chat_template
        if not self.takes_images:
            return None
        if self._folder_template is None:
            from radixserve.entrypoints.openai.chat_template import folder_chat_template

            folder = getattr(self.model_config, "model_dir", None)
            self._folder_template = folder_chat_template(folder) or ""
        return self._folder_template or None

    def require_tokenizer(self, what: str) -> Any:
        if self.tokenizer is None:
            raise ApiError(
                400, f"{what} needs a tokenizer, but the server runs with --skip-tokenizer-init."
            )
        return self.tokenizer

    def check_model(self, name: str | None) -> None:
        """OpenAI routes name a model. SGLang serves any name with the loaded model (the field
        only selects LoRA adapters), so a different name is accepted too; it is logged once per
        server, not per request, so a client that always sends another name cannot flood the log.
        """
        if name is None or name == "" or name == self.model_name:
            return
        if name in self.config.model_aliases or self._model_mismatch_logged:
            return
        self._model_mismatch_logged = True
        logger.warning(
            "A request names the model %r; this server serves %r and answers every request "
            "with it (logged once).",
            name,
            self.model_name,
        )

    def decode_token(self, token_id: int) -> str:
        tok = self.tokenizer
        if tok is None:
            return str(token_id)
        return str(tok.decode([token_id]))


def get_ctx(request: Request) -> ServingContext:
    return request.app.state.ctx
