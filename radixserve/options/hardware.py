"""What the machine offers, for resolving "auto" options. torch is imported only when needed."""

from __future__ import annotations

import ast
import functools
import importlib.util
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixserve.utils.auto_dtype import DtypeChoice

logger = logging.getLogger(__name__)

# cgroup v1 reports "no limit" as a huge number rather than "max".
_NO_CGROUP_LIMIT = 1 << 60


def detect_device() -> str:
    """'cuda' when a CUDA device is usable, else 'cpu'."""
    return "cuda" if cuda_available() else "cpu"


def cuda_available() -> bool:
    # Option parsing runs in the API process, which otherwise never imports torch (~270 MB,
    # ~1 s): a CPU-only build is recognised from its version file alone.
    if "torch" not in sys.modules and not torch_built_for_gpu():
        return False
    import torch

    return bool(torch.cuda.is_available())


@functools.cache
def torch_built_for_gpu() -> bool:
    """Whether the installed torch was built with CUDA or ROCm, read from torch/version.py
    without importing torch. True when that cannot be told (then torch itself is asked)."""
    try:
        spec = importlib.util.find_spec("torch")
        folders = list(spec.submodule_search_locations or []) if spec is not None else []
        return version_file_names_gpu(Path(folders[0], "version.py").read_text(encoding="utf-8"))
    except (ImportError, OSError, IndexError, ValueError):
        return True


def version_file_names_gpu(text: str) -> bool:
    """Whether a torch/version.py source sets `cuda` or `hip` to anything but None; True
    when it does not set both to constants (a build this code does not know)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return True
    values: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        else:
            continue
        if isinstance(target, ast.Name):
            try:
                values[target.id] = ast.literal_eval(value)
            except (ValueError, TypeError, SyntaxError):
                values[target.id] = "?"  # computed: not a constant None
    if "cuda" not in values or "hip" not in values:
        return True
    return values["cuda"] is not None or values["hip"] is not None


def cpu_auto_dtype() -> DtypeChoice:
    """What --dtype auto means on this CPU: bfloat16 where BF16 units exist and measurably win,
    else float32 (radixserve/utils/auto_dtype.py)."""
    from radixserve.utils.auto_dtype import cpu_auto_dtype as choose

    return choose()


def cuda_supports_bf16() -> bool:
    import torch

    return bool(torch.cuda.is_bf16_supported())


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _meminfo_total(meminfo: str) -> int | None:
    try:
        lines = Path(meminfo).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


def cpu_memory_bytes(
    meminfo: str = "/proc/meminfo",
    cgroup_files: tuple[str, ...] = (
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ),
) -> int | None:
    """Usable RAM: MemTotal, lowered to the container's cgroup limit when there is one.

    SGLang uses the smallest NUMA node instead; a container limit matters more here, since
    going past it gets the server killed.
    """
    total = _meminfo_total(meminfo)
    for path in cgroup_files:
        limit = _read_int(path)
        if limit is not None and limit < _NO_CGROUP_LIMIT:
            total = limit if total is None else min(total, limit)
    return total


def cuda_memory_bytes(index: int = 0) -> int | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(index).total_memory)


def device_memory_bytes(device: str) -> int | None:
    """Total memory of ``device`` ('cpu' or 'cuda'); None when unknown.

    ``mem_fraction_static`` is a fraction of this number, so the KV pool sizer should use it
    too.
    """
    if device == "cuda":
        return cuda_memory_bytes()
    if device == "cpu":
        return cpu_memory_bytes()
    return None
