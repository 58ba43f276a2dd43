"""Building a scheduler (model, tokenizer, pools) and the tokenizer every process needs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from radixserve.messages import SchedulerReady

if TYPE_CHECKING:
    from radixserve.managers.scheduler import Scheduler
    from radixserve.server_args import ServerArgs


def tokenizer_path_for(server_args: ServerArgs, model_dir: str) -> str:
    """An explicit --tokenizer-path wins; otherwise the model's folder (for a GGUF, the
    converted folder that holds the tokenizer files)."""
    if server_args.tokenizer_path and server_args.tokenizer_path != server_args.model_path:
        return server_args.tokenizer_path
    return model_dir


def load_tokenizer(server_args: ServerArgs, model_dir: str) -> Any | None:
    """The tokenizer, or None with --skip-tokenizer-init."""
    if server_args.skip_tokenizer_init:
        return None
    from radixserve.utils.tokenizer import get_tokenizer

    return get_tokenizer(
        tokenizer_path_for(server_args, model_dir),
        tokenizer_mode=server_args.tokenizer_mode,
        trust_remote_code=server_args.trust_remote_code,
        revision=server_args.revision,
    )


def build_scheduler(server_args: ServerArgs) -> tuple[Scheduler, Any | None, SchedulerReady]:
    """Load the model and make a scheduler; also what the API side needs to know about it."""
    from radixserve.managers.light_detokenizer import light_decoder_source
    from radixserve.managers.scheduler import Scheduler
    from radixserve.model_executor.model_runner import ModelRunner

    runner = ModelRunner(server_args)
    tokenizer = load_tokenizer(server_args, str(runner.model_dir))
    scheduler = Scheduler(server_args, runner, tokenizer)
    cfg = runner.model_config
    ready = SchedulerReady(
        model_dir=str(runner.model_dir),
        vocab_size=cfg.vocab_size,
        context_len=cfg.context_len,
        max_total_tokens=runner.plan.max_total_tokens,
        max_running_requests=runner.plan.max_running_requests,
        architectures=tuple(cfg.architectures),
        light_decoder=light_decoder_source(tokenizer) if tokenizer is not None else None,
    )
    return scheduler, tokenizer, ready
