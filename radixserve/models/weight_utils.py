"""Finding, reading and assigning checkpoint tensors.

Reading is a generator over (HF tensor name, CPU tensor), one tensor at a time, so peak memory is
the model plus one tensor. Assignment maps HF names onto fused parameters and checks that every
parameter (every shard of a fused one) was loaded.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import torch
from torch import nn
from tqdm.auto import tqdm

from radixserve.layers.linear import default_weight_loader
from radixserve.models import gguf

logger = logging.getLogger(__name__)

SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"


class StackedParam(NamedTuple):
    """Checkpoint tensors named `*.{shard_name}.*` load into shard `shard_id` of `param_name`."""

    param_name: str
    shard_name: str
    shard_id: str | int


class WeightFiles(NamedTuple):
    files: list[Path]
    use_safetensors: bool


def resolve_local_model(path: Path, load_format: str = "auto", with_weights: bool = True) -> Path:
    """The HF folder for an existing local model path; a GGUF is converted (or its cached
    conversion reused) first: in full, or without weights when they are read from the GGUF
    itself (--quantization gguf) or only the config is wanted."""
    gguf_file = gguf.find_gguf_file(path, force=load_format == "gguf")
    if gguf_file is not None:
        if with_weights:
            return gguf.ensure_converted(gguf_file)
        return gguf.ensure_metadata(gguf_file)
    if path.is_file():
        raise ValueError(f"model path {path} is a file but not a .gguf; pass the model folder")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no config.json in model folder {path}")
    return path


def find_weight_files(model_dir: Path, load_format: str = "auto") -> WeightFiles:
    """The checkpoint files of an HF folder: safetensors (via the index when there is one),
    else *.bin. load_format "safetensors" or "pt" restricts the choice."""
    if load_format in ("auto", "safetensors"):
        files = _indexed_or_globbed(model_dir, SAFETENSORS_INDEX, "*.safetensors")
        if files:
            return WeightFiles(files, True)
        if load_format == "safetensors":
            raise FileNotFoundError(f"no *.safetensors weight files in {model_dir}")
    files = _indexed_or_globbed(model_dir, BIN_INDEX, "*.bin")
    files = [f for f in files if f.name != "training_args.bin"]
    if not files:
        raise FileNotFoundError(f"no weight files (*.safetensors or *.bin) in {model_dir}")
    return WeightFiles(files, False)


def _indexed_or_globbed(model_dir: Path, index_name: str, pattern: str) -> list[Path]:
    index = model_dir / index_name
    if not index.is_file():
        # A folder may also hold a consolidated copy of the same weights; without an index,
        # prefer the HF-named shards when both exist.
        files = sorted(model_dir.glob(pattern))
        hf_named = [f for f in files if not f.name.startswith("consolidated")]
        return hf_named or files
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"corrupt checkpoint index {index}: {e}") from e
    files = [model_dir / name for name in sorted(set(weight_map.values()))]
    for f in files:
        if not f.is_file():
            raise FileNotFoundError(f"weight file {f} listed in {index} does not exist")
    return files


def iterate_weights(
    files: WeightFiles, progress: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of every file, with a progress bar over tensors."""
    if files.use_safetensors:
        yield from _iterate_safetensors(files.files, progress)
    else:
        yield from _iterate_bin(files.files, progress)


_SAFETENSORS_DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def _iterate_safetensors(
    paths: Sequence[Path], progress: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    """Each tensor read with plain file reads into a buffer of its own, not through a memory
    map: mapped pages stay in the process's RSS until the map closes, which made loading peak
    at the checkpoint's size on top of the model's (the page cache, which reads fill, is not
    the process's memory). The format is the 8-byte header length, the JSON header, the data."""
    headers = [(path, *_safetensors_header(path)) for path in paths]
    total = sum(len(header) for _, header, _ in headers)
    with tqdm(total=total, desc="Loading weights", unit="tensor", disable=not progress) as bar:
        for path, header, base in headers:
            with path.open("rb") as f:
                for name in sorted(header):
                    yield name, _read_tensor(f, path, name, header[name], base)
                    bar.update(1)


def _safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    """A safetensors file's tensor entries and the offset its data starts at."""
    try:
        with path.open("rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if not 0 < length <= min(path.stat().st_size - 8, 100 * 2**20):
                raise ValueError(f"invalid header length {length}")
            header = json.loads(f.read(length))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
    except (OSError, ValueError) as e:
        raise ValueError(f"corrupt safetensors file {path}: {e}") from e
    header.pop("__metadata__", None)
    return header, 8 + length


def checkpoint_matrix_dtype(path: Path) -> torch.dtype | None:
    """The dtype of the first 2-D tensor (by name) of a safetensors file, from its header; None
    for a corrupt file (the weight loader reports it, naming the file) or no 2-D tensor."""
    try:
        header, _ = _safetensors_header(path)
    except ValueError:
        return None
    for name in sorted(header):
        info = header[name]
        if isinstance(info, dict) and len(info.get("shape", ())) == 2:
            return _SAFETENSORS_DTYPES.get(info.get("dtype"))
    return None


def _read_tensor(f: BinaryIO, path: Path, name: str, info: Any, base: int) -> torch.Tensor:
    if isinstance(info, dict) and info.get("dtype") not in _SAFETENSORS_DTYPES:
        raise ValueError(
            f"safetensors file {path}: tensor {name} has dtype {info.get('dtype')!r}, which "
            f"radixserve does not load (supported: {', '.join(_SAFETENSORS_DTYPES)})"
        )
    try:
        dtype = _SAFETENSORS_DTYPES[info["dtype"]]
        start, end = (int(v) for v in info["data_offsets"])
        shape = [int(d) for d in info["shape"]]
        buffer = torch.empty(end - start, dtype=torch.uint8)
        f.seek(base + start)
        if f.readinto(memoryview(buffer.numpy())) != end - start:
            raise ValueError("the file ends inside the tensor")
        return buffer.view(dtype).reshape(shape)
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"corrupt safetensors file {path} ({name}): {e}") from e


def read_named_tensors(
    model_dir: Path, wanted: Callable[[str], bool]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of a folder's safetensors checkpoint whose names `wanted` accepts, read
    alone (headers first: nothing else is read). Nothing for a folder without safetensors
    files (a GGUF's converted folder, a *.bin checkpoint)."""
    files = _indexed_or_globbed(model_dir, SAFETENSORS_INDEX, "*.safetensors")
    for path in files:
        header, base = _safetensors_header(path)
        names = [name for name in sorted(header) if wanted(name)]
        if not names:
            continue
        with path.open("rb") as f:
            for name in names:
                yield name, _read_tensor(f, path, name, header[name], base)


def _iterate_bin(paths: Sequence[Path], progress: bool) -> Iterator[tuple[str, torch.Tensor]]:
    for path in tqdm(paths, desc="Loading weights", unit="file", disable=not progress):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as e:
            raise ValueError(f"corrupt PyTorch weight file {path}: {e}") from e
        if not isinstance(state, dict):
            raise ValueError(f"PyTorch weight file {path} does not hold a state dict")
        yield from state.items()
        del state


def load_weights_into(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    stacked_params: Sequence[StackedParam] = (),
    skip_names: Sequence[str] = (),
    resolve: Callable[[str], tuple[str, Any] | None] | None = None,
) -> None:
    """Assign HF-named tensors to `model`'s parameters; raise if any parameter stays unloaded.

    Tensors whose name contains one of `skip_names` are ignored; names the model does not know
    are logged and ignored (checkpoints often carry extras such as rotary caches). `resolve`,
    tried before `stacked_params`, maps names whose shard is part of the name (a MoE layer's
    per-expert tensors) to (parameter name, shard id), or returns None.
    """
    params = dict(model.named_parameters())
    loaded: set[tuple[str, object]] = set()
    for name, tensor in weights:
        if any(skip in name for skip in skip_names):
            continue
        resolved = resolve(name) if resolve is not None else None
        param_name, shard_id = resolved or _map_name(name, stacked_params)
        param = params.get(param_name)
        if param is None:
            logger.warning("Ignoring checkpoint tensor %s: the model has no such parameter", name)
            continue
        loader = getattr(param, "weight_loader", default_weight_loader)
        try:
            with torch.no_grad():
                loader(param, tensor, shard_id)
        except ValueError as e:
            raise ValueError(f"cannot load checkpoint tensor {name}: {e}") from e
        loaded.add((param_name, shard_id))
    _check_complete(params, loaded, stacked_params)


def _map_name(name: str, stacked_params: Sequence[StackedParam]) -> tuple[str, str | int | None]:
    for param_name, shard_name, shard_id in stacked_params:
        part = f".{shard_name}."
        if part in name:
            return name.replace(part, f".{param_name}."), shard_id
    return name, None


def _check_complete(
    params: dict[str, nn.Parameter],
    loaded: set[tuple[str, object]],
    stacked_params: Sequence[StackedParam],
) -> None:
    missing: list[str] = []
    for name, param in params.items():
        if getattr(param, "held_as_blocks", False):  # --quantization gguf: loaded as blocks
            continue
        for shard_id in getattr(param, "shard_ids", (None,)):
            if (name, shard_id) not in loaded:
                missing.append(_hf_name(name, shard_id, stacked_params))
    if missing:
        shown = ", ".join(missing[:8]) + (
            f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        )
        raise ValueError(f"the checkpoint is missing tensors: {shown}")


def _hf_name(name: str, shard_id: object, stacked_params: Sequence[StackedParam]) -> str:
    for param_name, shard_name, sid in stacked_params:
        if sid == shard_id and f".{param_name}." in name:
            return name.replace(f".{param_name}.", f".{shard_name}.")
    return name
