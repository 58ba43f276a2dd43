"""Building a scheduler (model, tokenizer, pools) and the tokenizer every process needs."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from radixserve.messages import SchedulerReady

if TYPE_CHECKING:
    from radixserve.managers.scheduler import Scheduler
    from radixserve.server_args import ServerArgs

logger = logging.getLogger(__name__)


def tokenizer_path_for(server_args: ServerArgs, model_dir: str) -> str:
    """An explicit --tokenizer-path wins; otherwise the model's folder (for a GGUF, the
    converted folder that holds the tokenizer files)."""
    if server_args.tokenizer_path and server_args.tokenizer_path != server_args.model_path:
        return server_args.tokenizer_path
    return model_dir


def load_tokenizer(
    server_args: ServerArgs, model_dir: str, *, light: bool = False, class_name: str | None = None
) -> Any | None:
    """The tokenizer, or None with --skip-tokenizer-init.

    AutoTokenizer's, or the class AutoTokenizer chose for this folder at an earlier start
    (utils/light_tokenizer.py), loaded without AutoTokenizer: its auto modules import torch,
    and ~1 s of transformers' configuration code. `light` (the API and detokenizer processes,
    which must not import torch): the class `class_name` (the scheduler's AutoTokenizer's
    choice), else the remembered one, else the one the folder declares, where it can be told;
    AutoTokenizer only where none of these loads."""
    if server_args.skip_tokenizer_init:
        return None
    path = tokenizer_path_for(server_args, model_dir)
    plain = _plain(server_args)
    if plain:
        tokenizer = _load_without_auto_tokenizer(path, light, class_name)
        if tokenizer is not None:
            return tokenizer
    from radixserve.models.tokenizer import get_tokenizer, tokenizer_source

    tokenizer = get_tokenizer(
        path,
        tokenizer_mode=server_args.tokenizer_mode,
        trust_remote_code=server_args.trust_remote_code,
        revision=server_args.revision,
    )
    if plain and class_name is None:
        from radixserve.utils.light_tokenizer import remember_class

        remember_class(tokenizer_source(path), tokenizer)
    return tokenizer


def _load_without_auto_tokenizer(path: str, light: bool, class_name: str | None) -> Any | None:
    from radixserve.models.tokenizer import tokenizer_source
    from radixserve.utils.light_tokenizer import (
        load_named_class,
        load_predicted,
        remembered_class,
    )

    try:
        source = tokenizer_source(path)
        chosen = class_name or remembered_class(source)
        if chosen is not None:
            return load_named_class(chosen, source)
        return load_predicted(source) if light else None
    except Exception as e:  # AutoTokenizer, next, says what is wrong in its own words
        logger.debug("loading the tokenizer of %s by class failed (%s)", path, e)
        return None


class EarlyTokenizer:
    """The API process's tokenizer, loaded on a thread while the scheduler process loads the
    model (loading it after, the first import of transformers' tokenizer code made ~2.4 s of a
    1B GGUF's ~7 s start-up), without AutoTokenizer where it can (`load_tokenizer`'s light
    path). It is used only if it comes from the folder the scheduler reports and is of the
    class the scheduler's AutoTokenizer loaded; otherwise (or if it failed) `get` loads that."""

    def __init__(self, server_args: ServerArgs, start: bool = True) -> None:
        import threading

        self._args = server_args
        self._result: tuple[str, Any] | None = None
        self._thread: threading.Thread | None = None
        if start:
            self.start()

    def start(self) -> None:
        """Begin loading on a thread (once; nothing with --skip-tokenizer-init)."""
        import threading

        if self._thread is None and not self._args.skip_tokenizer_init:
            self._thread = threading.Thread(target=self._load, name="early-tokenizer", daemon=True)
            self._thread.start()

    def _load(self) -> None:
        from radixserve.models.tokenizer import tokenizer_source
        from radixserve.utils.cpu_threads import yield_cpu_to_the_model

        yield_cpu_to_the_model()
        try:
            path = tokenizer_path_for(self._args, self._args.model_path)
            source = str(tokenizer_source(path))
            self._result = (source, load_tokenizer(self._args, path, light=True))
        except Exception as e:  # any failure: the regular load after the scheduler is ready
            logger.debug("early tokenizer load failed (%s); loading it after the model", e)

    def get(self, model_dir: str, class_name: str | None = None) -> Any | None:
        """The tokenizer for the scheduler's `model_dir`, of the class `class_name` that the
        scheduler's AutoTokenizer chose (None: not known)."""
        from radixserve.models.tokenizer import tokenizer_source
        from radixserve.utils.light_tokenizer import tokenizer_class_name

        if self._thread is not None:
            self._thread.join()
        expected = tokenizer_path_for(self._args, model_dir)
        if self._result is not None and self._result[0] == str(tokenizer_source(expected)):
            tokenizer = self._result[1]
            if class_name is None or tokenizer_class_name(tokenizer) == class_name:
                return tokenizer
            logger.info(
                "The tokenizer class %s was predicted, AutoTokenizer chose %s: loading that",
                tokenizer_class_name(tokenizer),
                class_name,
            )
        return load_tokenizer(self._args, model_dir, light=True, class_name=class_name)


def build_scheduler(
    server_args: ServerArgs, decode_only_tokenizer: bool = False
) -> tuple[Scheduler, Any | None, SchedulerReady]:
    """Load the model and make a scheduler; also what the API side needs to know about it.
    `decode_only_tokenizer` (the scheduler process): the tokenizer may be the decode-only one
    remembered from an earlier start (managers/scheduler_tokenizer.py)."""
    from radixserve.managers.image_intake import image_prompt
    from radixserve.managers.scheduler import Scheduler
    from radixserve.model_executor.model_runner import ModelRunner

    runner = ModelRunner(server_args)
    tokenizer, light_decoder, class_name = _scheduler_tokenizer(
        server_args, str(runner.model_dir), decode_only_tokenizer
    )
    scheduler = Scheduler(server_args, runner, tokenizer)
    cfg = runner.model_config
    ready = SchedulerReady(
        model_dir=str(runner.model_dir),
        vocab_size=cfg.vocab_size,
        context_len=cfg.context_len,
        max_total_tokens=runner.plan.max_total_tokens,
        max_running_requests=runner.plan.max_running_requests,
        architectures=tuple(cfg.architectures),
        light_decoder=light_decoder,
        tokenizer_class=class_name,
        kernels=runner.kernel_summary,
        image_prompt=image_prompt(runner.model, tokenizer),
    )
    return scheduler, tokenizer, ready


def _scheduler_tokenizer(
    server_args: ServerArgs, model_dir: str, decode_only: bool
) -> tuple[Any | None, str | None, str | None]:
    """(the scheduler's tokenizer, its checked decode-only decoder, AutoTokenizer's class)."""
    from radixserve.managers import scheduler_tokenizer
    from radixserve.managers.light_detokenizer import light_decoder_source
    from radixserve.models.tokenizer import tokenizer_source
    from radixserve.utils.light_tokenizer import tokenizer_class_name

    if server_args.skip_tokenizer_init:
        return None, None, None
    plain = decode_only and _plain(server_args)
    source = tokenizer_source(tokenizer_path_for(server_args, model_dir)) if plain else None
    if source is not None:
        remembered = scheduler_tokenizer.remembered(
            source, lambda: load_tokenizer(server_args, model_dir)
        )
        if remembered is not None:
            return remembered, remembered.light_decoder_source, remembered.class_name
    tokenizer = load_tokenizer(server_args, model_dir)
    light_decoder = light_decoder_source(tokenizer)
    if source is not None and light_decoder is not None:
        scheduler_tokenizer.remember(source, tokenizer, light_decoder)
    return tokenizer, light_decoder, tokenizer_class_name(tokenizer)


def _plain(server_args: ServerArgs) -> bool:
    """A tokenizer AutoTokenizer loads by its defaults (what remembered choices apply to)."""
    return server_args.tokenizer_mode == "auto" and server_args.revision is None
