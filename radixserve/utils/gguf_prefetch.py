"""Reading a GGUF model's quantized blocks on a thread while the scheduler process imports torch.

Loading a 1B Q4_K_M's blocks is ~0.35-0.45 s of plain file reads, nearly all of it the kernel
faulting in fresh pages and copying from the page cache, with the GIL released; importing torch
is ~1.1 s of Python holding the GIL. Started before that import (the tensor table is cached
JSON, no torch needed), the reads run on the other core meanwhile, into one anonymous mapping
laid out as the loader lays the blocks out (models/gguf_quant.py: a fused layer's parts of one
block type joined row-wise, else one region per part). The loader then takes each region as a
tensor over that memory (`take`, `region`) instead of reading it, and reads whatever is missing
itself, as before. Loading holds the same one copy of the blocks.

The two still contend (page-table updates, memory bandwidth): in one process torch's import
goes ~1.15 -> ~1.38 s while the load goes 0.58 -> 0.23 s. Served, the 1B Q4_K_M's start-up
went 2.56 -> 2.46 s (medians of 4 interleaved starts, quiet; the mapping then populated whole).

Only for what the loader reads whole: one rank (no tensor or pipeline split), the CPU,
`--quantization gguf`, a .gguf file as the model path.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import threading
from pathlib import Path
from typing import Any, NamedTuple

from radixserve.kernels.gguf_types import QUANTIZED_TYPES

logger = logging.getLogger(__name__)

# A model's linear layers and the GGUF tensors each one is made of, in row order.
FUSED_PARTS = {
    "self_attn.qkv_proj": ("attn_q", "attn_k", "attn_v"),
    "self_attn.o_proj": ("attn_output",),
    "mlp.gate_up_proj": ("ffn_gate", "ffn_up"),
    "mlp.down_proj": ("ffn_down",),
}
# Read whole as their own tensors (the LM head only where the file has one).
SINGLE_TENSORS = ("token_embd.weight", "output.weight")
ALIGN = 64  # as torch's own allocations
MADV_POPULATE_WRITE = 23  # linux/mman.h; Python's mmap module does not name it
_LAYER = re.compile(r"^blk\.(\d+)\.")


class Region(NamedTuple):
    offset: int  # in the mapping
    n_bytes: int


def fused_groups(tensors: dict[str, Any], num_layers: int) -> list[tuple[str, ...]]:
    """The groups of tensor names the loader reads into one tensor each: per layer and fused
    layer, all parts joined when all are quantized with one block type, each part alone when
    their types differ; nothing for a layer with an unquantized or missing part (loaded as
    float). `tensors` maps names to entries with `tensor_type`."""
    groups: list[tuple[str, ...]] = []
    for i in range(num_layers):
        for parts in FUSED_PARTS.values():
            names = tuple(f"blk.{i}.{p}.weight" for p in parts)
            entries = [tensors.get(n) for n in names]
            if any(e is None or int(e.tensor_type) not in QUANTIZED_TYPES for e in entries):
                continue
            if len({int(e.tensor_type) for e in entries}) == 1:
                groups.append(names)
            else:
                groups += [(n,) for n in names]
    return groups


def _populate(buffer: mmap.mmap, size: int) -> None:
    """Fault the mapping's pages in ahead of the reads, 16 MiB at a time (Linux 5.14+
    MADV_POPULATE_WRITE; elsewhere the reads fault them). One pass in the kernel beats a fault
    per page, and in chunks it leaves the process's memory map free in between: populated
    whole (MAP_POPULATE), it held up the main thread ~0.25 s, which was importing torch."""
    step = 16 << 20
    for at in range(0, size, step):
        try:
            buffer.madvise(MADV_POPULATE_WRITE, at, min(step, size - at))
        except (OSError, ValueError):
            return


class Prefetch:
    """The blocks of `groups` read from `path` on a thread into one anonymous mapping."""

    def __init__(self, path: Path, tensors: dict[str, Any], groups: list[tuple[str, ...]]):
        self.path = path
        self._regions: dict[tuple[str, ...], Region] = {}
        offset = 0
        for group in groups:
            size = sum(int(tensors[n].n_bytes) for n in group)
            self._regions[group] = Region(offset, size)
            offset += -(-size // ALIGN) * ALIGN
        self._tensors = tensors
        self._size = max(offset, 1)
        self.buffer: mmap.mmap | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._read, name="gguf-prefetch", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            buffer = mmap.mmap(-1, self._size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            _populate(buffer, self._size)
            view = memoryview(buffer)
            fd = os.open(self.path, os.O_RDONLY)
            try:
                for group, region in self._regions.items():
                    at = region.offset
                    for name in group:
                        entry = self._tensors[name]
                        n = int(entry.n_bytes)
                        if os.preadv(fd, [view[at : at + n]], int(entry.data_offset)) != n:
                            raise ValueError(f"GGUF file {self.path} ends inside tensor {name}")
                        at += n
            finally:
                os.close(fd)
                view.release()
            self.buffer = buffer
        except BaseException as exc:  # the loader then reads for itself
            self._error = exc

    def wait(self) -> bool:
        """Whether the reads succeeded (waiting for them)."""
        self._thread.join()
        if self._error is not None:
            logger.debug("GGUF prefetch of %s failed: %s", self.path, self._error)
        return self.buffer is not None

    def region(self, group: tuple[str, ...]) -> Region | None:
        """Where the group's bytes are (parts consecutive, in order), if they were read."""
        return self._regions.get(group) if self.wait() else None


_pending: dict[Path, Prefetch] = {}
_lock = threading.Lock()


def start(model_path: str | os.PathLike[str]) -> Prefetch | None:
    """Begin reading the blocks of the GGUF file `model_path` (None when it is not one whose
    table can be read now); the loader picks them up with `take`."""
    from radixserve.utils.gguf_cache import tensor_table

    path = Path(model_path).expanduser()
    if path.suffix.lower() != ".gguf" or not path.is_file():
        return None
    try:
        table = tensor_table(path)
    except (OSError, ValueError) as exc:  # the loader reports it, with its reason
        logger.debug("no GGUF prefetch for %s: %s", path, exc)
        return None
    tensors = {t.name: t for t in table}
    layers = [int(m.group(1)) for n in tensors if (m := _LAYER.match(n))]
    groups = fused_groups(tensors, max(layers, default=-1) + 1)
    groups += [
        (n,)
        for n in SINGLE_TENSORS
        if n in tensors and int(tensors[n].tensor_type) in QUANTIZED_TYPES
    ]
    prefetch = Prefetch(path, tensors, groups)
    with _lock:
        _pending[path.resolve()] = prefetch
    return prefetch


def start_for(server_args: Any) -> Prefetch | None:
    """`start` where the scheduler process will load the model's blocks whole (see above)."""
    whole = (
        server_args.quantization == "gguf"
        and server_args.device == "cpu"
        and server_args.tp_size == 1
        and server_args.pp_size == 1
        and server_args.load_format in ("auto", "gguf")
    )
    return start(server_args.model_path) if whole else None


def take(path: str | os.PathLike[str]) -> Prefetch | None:
    """The prefetch started for the GGUF file `path`, handed out once."""
    with _lock:
        return _pending.pop(Path(path).expanduser().resolve(), None)
