"""Changing a running ModelRunner's memory: new weights from disk (SGLang's
/update_weights_from_disk), reading a weight (/get_weights_by_name), and freeing and restoring
the KV pool and the weights (/release_memory_occupation, /resume_memory_occupation).

The scheduler calls these only when no batch can run (it drains or pauses first), so a forward
never sees a half-swapped model or a missing KV pool.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from radixserve.errors import InvalidRequestError
from radixserve.layers.attention.registry import FAST_KERNEL_BACKENDS
from radixserve.layers.fast_path import use_fast_kernels
from radixserve.mem_cache.kv_cache import KVCache
from radixserve.models.kv_layout import kv_layout

if TYPE_CHECKING:
    from radixserve.model_executor.model_runner import ModelRunner
    from radixserve.models.loader import LoadedModel

logger = logging.getLogger(__name__)

MEMORY_TAGS = ("kv_cache", "weights")


def _replaceable_quantizations() -> frozenset[str | None]:
    """Quantizations whose weights load the way the runner loaded them: float, GGUF blocks
    (--quantization gguf) and the quantize-on-load schemes."""
    from radixserve.models.quantize_on_load import SCHEMES

    return frozenset({None, "unquant", "gguf", *SCHEMES})


def _check_replaceable(runner: ModelRunner) -> None:
    args = runner.server_args
    if args.tp_size > 1 or args.pp_size > 1:
        raise InvalidRequestError(
            "Changing weights or memory at runtime needs --tp-size 1 and --pp-size 1."
        )
    if args.quantization not in _replaceable_quantizations():
        raise InvalidRequestError(
            f"Changing weights at runtime is not supported with --quantization {args.quantization}"
        )


def _load(runner: ModelRunner, model_path: str, load_format: str) -> LoadedModel:
    from radixserve.models.loader import load_model

    args = runner.server_args
    # The new weights take the form the served ones have: a GGUF's blocks under --quantization
    # gguf, projections quantized as they load under w8a8_int8 / bitsandbytes.
    return load_model(
        model_path,
        load_format=load_format,
        dtype=args.resolved_dtype,
        device=args.device,
        revision=args.revision,
        trust_remote_code=args.trust_remote_code,
        context_length=args.context_length,
        json_model_override_args=args.json_model_override_args,
        download_dir=args.download_dir,
        seed=args.random_seed,
        gguf_blocks=runner._gguf_blocks(),
        quantization=runner._on_load_quantization(),
    )


def _signature(model: torch.nn.Module) -> dict[str, tuple[tuple[int, ...], torch.dtype] | str]:
    """Each parameter's shape and dtype; "blocks" for a weight held as quantized blocks (its
    block type may differ between two files of one architecture: a Q4_K_M and a Q8_0)."""
    return {
        name: "blocks" if getattr(p, "held_as_blocks", False) else (tuple(p.shape), p.dtype)
        for name, p in model.named_parameters()
    }


def _is_gguf_file(path: str) -> bool:
    return Path(path).suffix.lower() == ".gguf"


def _install(runner: ModelRunner, loaded: LoadedModel, model_path: str, load_format: str) -> None:
    runner.model = loaded.model
    runner.model_dir = loaded.model_dir
    runner.weights_source = (model_path, load_format)
    args = runner.server_args
    use_fast_kernels(
        loaded.model,
        args.attention_backend in FAST_KERNEL_BACKENDS,
        repack_weights=not args.enable_torch_compile,
        deterministic=bool(args.enable_deterministic_inference),
    )


def weights_source(runner: ModelRunner) -> tuple[str, str]:
    source = getattr(runner, "weights_source", None)
    if source is None:
        args = runner.server_args
        source = (str(args.model_path), args.load_format)
    return source


WEIGHT_DIRS_ENV = "RADIXSERVE_WEIGHT_DIRS"


def _inside_allowed_dirs(runner: ModelRunner, model_path: str) -> bool:
    """New weights may come from beside the served model (a checkpoint's siblings) or from the
    folders the operator lists; a request cannot point the server anywhere else."""
    import os

    served = Path(runner.server_args.model_path).expanduser()
    allowed = [served.resolve().parent] if served.exists() else []
    extra = os.environ.get(WEIGHT_DIRS_ENV, "")
    allowed += [Path(d).expanduser().resolve() for d in extra.split(os.pathsep) if d.strip()]
    try:
        target = Path(model_path).expanduser().resolve()
    except (OSError, RuntimeError):  # a symlink loop
        return False
    return any(target == d or d in target.parents for d in allowed)


def update_weights_from_disk(runner: ModelRunner, model_path: str, load_format: str | None) -> None:
    """Load `model_path` into a new model of the same architecture and swap it in. The old
    model keeps serving (nothing changes) if the new files do not fit it."""
    _check_replaceable(runner)
    if runner.model is None:
        raise InvalidRequestError("The weights are released; resume them first.")
    if load_format == "dummy":
        raise InvalidRequestError("load_format dummy has no files to load.", "load_format")
    # A server started on dummy weights loads real files the usual way.
    fmt = load_format or weights_source(runner)[1]
    fmt = "auto" if fmt == "dummy" else fmt
    # Only a local model folder: never a hub download, never an arbitrary file. Errors do not
    # echo the path or what reading it said (the request chose it; the log has the details).
    if not _inside_allowed_dirs(runner, model_path):
        raise InvalidRequestError(
            "model_path must lie in the folder that holds the served model, or in a folder "
            f"listed in ${WEIGHT_DIRS_ENV} on the server.",
            "model_path",
        )
    served_gguf = _is_gguf_file(str(runner.server_args.model_path))
    if served_gguf and runner._gguf_blocks():
        # The model runs on a GGUF's blocks: the new weights are another .gguf file.
        if not (_is_gguf_file(model_path) and Path(model_path).is_file()):
            raise InvalidRequestError(
                "This server runs a GGUF file's blocks (--quantization gguf): model_path must be "
                "a .gguf file of the same architecture.",
                "model_path",
            )
    elif not (Path(model_path) / "config.json").is_file() and not (
        _is_gguf_file(model_path) and Path(model_path).is_file()
    ):
        raise InvalidRequestError(
            "model_path must be a local model folder with a config.json and weight files, or a "
            ".gguf file.",
            "model_path",
        )
    try:
        loaded = _load(runner, model_path, fmt)
    except Exception as exc:  # missing or unreadable weight files, a bad config
        logger.warning("Loading new weights failed: %s", exc)
        raise InvalidRequestError(
            f"Failed to load the weights ({type(exc).__name__}); see the server log.",
            "model_path",
        ) from exc
    old = runner.model_config.architectures
    if list(loaded.config.architectures) != list(old):
        raise InvalidRequestError(
            f"The new weights are a {loaded.config.architectures} model; this server runs {old}."
        )
    before, after = _signature(runner.model), _signature(loaded.model)
    if before != after:
        differ = sorted(set(before) ^ set(after)) or [
            n for n in before if before[n] != after.get(n)
        ]
        raise InvalidRequestError(
            f"The new weights do not match the running model's parameters (e.g. {differ[:3]})."
        )
    _install(runner, loaded, model_path, fmt)
    logger.info("Updated weights from %s", model_path)


def get_weights_by_name(runner: ModelRunner, name: str, truncate_size: int) -> list[Any]:
    """The first `truncate_size` rows of a parameter, as nested lists of floats."""
    if runner.model is None:
        raise InvalidRequestError("The weights are released; resume them first.")
    params = dict(runner.model.named_parameters())
    param = params.get(name)
    if param is None:
        raise InvalidRequestError(f"No parameter named {name!r}.", "name")
    if param.numel() == 0:  # dropped for its quantized blocks
        raise InvalidRequestError(
            f"Parameter {name!r} has no float values on this server: --quantization "
            f"{runner.server_args.quantization} keeps it as quantized blocks.",
            "name",
        )
    return param.detach()[:truncate_size].to(torch.float32).cpu().tolist()


def check_tags(tags: list[str] | None) -> tuple[str, ...]:
    chosen = tuple(tags) if tags else MEMORY_TAGS
    unknown = [t for t in chosen if t not in MEMORY_TAGS]
    if unknown:
        raise InvalidRequestError(
            f"Unknown memory tags {unknown}; this server has {list(MEMORY_TAGS)}.", "tags"
        )
    return chosen


def release_memory(runner: ModelRunner, tags: tuple[str, ...]) -> None:
    _check_replaceable(runner)
    if "kv_cache" in tags and runner.kv_cache is not None:
        runner.kv_cache = None  # the buffers are freed with the last reference
    if "weights" in tags and runner.model is not None:
        runner.model = None


def resume_memory(runner: ModelRunner, tags: tuple[str, ...]) -> None:
    if "kv_cache" in tags and runner.kv_cache is None:
        cfg = runner.model_config
        layout = kv_layout(cfg, cfg.num_key_value_heads)
        scales = runner._kv_scales(layout.v_shares_k)
        runner.kv_cache = KVCache(
            size=runner.kv_cache_size,
            num_layers=cfg.num_hidden_layers,
            num_kv_heads=layout.num_kv_heads,
            head_dim=layout.head_dim,
            dtype=runner._kv_dtype(),
            device=runner.device,
            v_shares_k=layout.v_shares_k,
            k_scales=scales.k,
            v_scales=scales.v,
        )
    if "weights" in tags and runner.model is None:
        path, fmt = weights_source(runner)
        _install(runner, _load(runner, path, fmt), path, fmt)
