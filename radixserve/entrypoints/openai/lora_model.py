"""Which LoRA adapter an OpenAI request asks for, SGLang's way: an explicit `lora_path` wins;
else `model: "<served model>:<adapter>"`; else `model` naming a loaded adapter (the ids
/v1/models lists); else the base model."""

from __future__ import annotations

from typing import Any

from radixserve.entrypoints.openai.errors import ApiError
from radixserve.entrypoints.serving_context import ServingContext


def adapter_names(ctx: ServingContext) -> list[str]:
    registry = getattr(ctx.engine, "lora", None)
    if registry is None or not getattr(registry, "enabled", False):
        return []
    return [ref.name for ref in registry.refs()]


def resolve_model_and_adapter(ctx: ServingContext, model: str | None, lora_path: Any) -> Any:
    """Check `model` and return the request's adapter name(s) (None: the base model)."""
    names = adapter_names(ctx)
    adapter: str | None = None
    if model and names:
        if model in names and model != ctx.model_name:
            adapter = model
        elif ":" in model and model not in (ctx.model_name, *ctx.config.model_aliases):
            prefix = f"{ctx.model_name}:"
            base, name = (
                (ctx.model_name, model[len(prefix) :])
                if model.startswith(prefix)
                else model.split(":", 1)
            )
            ctx.check_model(base)
            if name not in names:
                raise ApiError(
                    400,
                    f"LoRA adapter {name!r} is not loaded (loaded: {', '.join(names)}).",
                    param="model",
                )
            adapter = name
        else:
            ctx.check_model(model)
    else:
        ctx.check_model(model)
    if lora_path is not None:
        return lora_path  # the engine checks it names loaded adapters (400 naming lora_path)
    return adapter
