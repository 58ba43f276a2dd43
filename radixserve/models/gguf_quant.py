"""--quantization gguf: load a GGUF file's weights straight into the model, linear layers on
their quantized blocks.

No float copy of a quantized weight is ever made: each linear layer takes the file's blocks
(q|k|v and gate|up rows concatenated; llama.cpp's q/k row order undone on whole rows of blocks,
which is exact), the token embedding keeps its blocks too (lookups dequantize the rows they
read; a tied LM head multiplies the same blocks), and only the small float tensors (norms,
biases, and any weight the file stores as F32/F16/BF16) are dequantized and loaded through the
model's usual loader. Parts of one fused layer may use different block types (Q4_K_M files store
attn_v and ffn_down as Q6_K in some layers): the layer then runs one matmul per part.

Tensors are read with plain file reads (the reader's memory map serves only the tensor table), so
loading holds about one copy of the weights; in the scheduler process the quantized blocks were
usually read already, on a thread while torch was imported (utils/gguf_prefetch.py).
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from radixserve.layers import gguf_formats as gt
from radixserve.layers.gguf_formats import dequantize
from radixserve.layers.moe import ExpertBlocks, FusedMoE, use_gguf_experts
from radixserve.layers.quantization import use_gguf_blocks
from radixserve.models.gguf import hf_float_value, hf_tensor_name, unpermute_qk
from radixserve.models.gguf_shard import (
    shard_expert_blocks,
    shard_linear_blocks,
    shard_vocab_blocks,
)
from radixserve.utils import gguf_prefetch
from radixserve.utils.gguf_cache import TensorEntry, tensor_table

logger = logging.getLogger(__name__)

_FUSED_PARTS = gguf_prefetch.FUSED_PARTS
# A MoE layer's shared expert (Qwen2-MoE), fused like the dense MLP.
_SHARED_EXPERT_PARTS = {
    "mlp.shared_expert.gate_up_proj": ("ffn_gate_shexp", "ffn_up_shexp"),
    "mlp.shared_expert.down_proj": ("ffn_down_shexp",),
}
# Multi-head latent attention's own projections (DeepSeek-V2), each a linear layer of its own;
# kv_b_proj is not one (attention folds it into the query and output) and stays float.
_MLA_PARTS = {
    "self_attn.q_proj": ("attn_q",),
    "self_attn.q_a_proj": ("attn_q_a",),
    "self_attn.q_b_proj": ("attn_q_b",),
    "self_attn.kv_a_proj_with_mqa": ("attn_kv_a_mqa",),
}
# A MoE layer's routed experts, each tensor [experts, rows, row bytes] of blocks.
_EXPERT_PARTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
# The same, one tensor per expert (Mixtral files converted before llama.cpp stacked experts).
_OLD_EXPERT_PARTS = ("ffn_gate", "ffn_up", "ffn_down")


class QuantSummary(NamedTuple):
    quantized_layers: int
    float_layers: int
    quantized_bytes: int
    types: dict[str, int]  # block type name -> tensors kept on blocks


class _GGUFFile:
    """The tensor table (utils/gguf_cache.py: parsed once, then cached) and one open handle the
    tensors' bytes are read with: plain file reads are ~2.5x faster than copying out of the
    reader's memory map (no page faults), and the map's pages are never touched, so they never
    count in this process's memory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tensors = {t.name: t for t in tensor_table(path)}
        self._file = path.open("rb")

    def __enter__(self) -> _GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()

    def read(self, tensor: TensorEntry) -> torch.Tensor:
        """A tensor's bytes as [rows, row bytes] uint8 of its own ([elements, element bytes]
        for a float tensor)."""
        out = torch.empty(tensor.n_bytes, dtype=torch.uint8)
        self.read_into(tensor, out)
        return out.view(tensor.rows, -1)

    def read_into(self, tensor: TensorEntry, out: torch.Tensor) -> None:
        """A tensor's bytes into `out`, a contiguous uint8 tensor of exactly that size."""
        if not out.is_contiguous() or out.numel() != tensor.n_bytes:
            raise ValueError(f"{tensor.name}: {tensor.n_bytes} bytes do not fit {tuple(out.shape)}")
        self._file.seek(tensor.data_offset)
        if self._file.readinto(memoryview(out.reshape(-1).numpy())) != tensor.n_bytes:
            raise ValueError(f"GGUF file {self.path} ends inside tensor {tensor.name}")


def load_gguf_weights(
    model: nn.Module,
    gguf_path: Path,
    num_heads: int,
    num_kv_heads: int,
    permuted_qk: bool,
    tied_lm_head: bool,
    progress: bool = True,
    arch: str = "llama",
    extra_tensors: Iterable[tuple[str, torch.Tensor]] | None = None,
) -> QuantSummary:
    """Fill `model` (built with uninitialised weights) from `gguf_path`, a GGUF of
    general.architecture `arch` (its tensor names and float conventions). `extra_tensors`
    (HF-named, e.g. an mmproj file's vision tower) load with the file's float tensors."""
    with _GGUFFile(gguf_path) as file:
        return _load(
            model,
            file,
            num_heads,
            num_kv_heads,
            permuted_qk,
            tied_lm_head,
            progress,
            arch,
            extra_tensors or (),
        )


def _load(
    model: nn.Module,
    file: _GGUFFile,
    num_heads: int,
    num_kv_heads: int,
    permuted_qk: bool,
    tied_lm_head: bool,
    progress: bool,
    arch: str,
    extra_tensors: Iterable[tuple[str, torch.Tensor]] = (),
) -> QuantSummary:
    raw = file.tensors
    prefetch = gguf_prefetch.take(file.path)  # blocks read while torch was imported, if any
    heads = {"attn_q": num_heads, "attn_k": num_kv_heads} if permuted_qk else {}
    on_blocks: set[str] = set()
    types: Counter[int] = Counter()  # GGML type -> tensors kept on blocks
    quantized = kept = nbytes = 0
    bar = tqdm(
        total=len(raw), desc=f"Loading {file.path.name}", unit="tensor", disable=not progress
    )
    for i, layer in enumerate(model.model.layers):
        # (A pipeline stage's missing layers have no mlp.)
        experts = getattr(getattr(layer, "mlp", None), "experts", None)
        if isinstance(experts, FusedMoE):
            loaded = _load_experts(file, experts, i)
            if loaded is None:
                kept += 1  # float experts: loaded below
            else:
                names, parts = loaded
                on_blocks.update(names)
                bar.update(len(names))
                types.update(p.qtype for p in parts)
                quantized += 1
                nbytes += sum(p.blocks.numel() for p in parts)
        for path, parts in _layer_parts(layer).items():
            names = [f"blk.{i}.{p}.weight" for p in parts]
            tensors = [raw.get(n) for n in names]
            if any(t is None or int(t.tensor_type) not in gt.QUANTIZED_TYPES for t in tensors):
                kept += 1  # loaded as float below (or reported missing by the loader)
                continue
            blocks = _read_fused(file, tensors, [heads.get(p) for p in parts], prefetch)
            module = layer.get_submodule(path)
            blocks = shard_linear_blocks(module, blocks, [t.rows for t in tensors])
            for _, qtype in blocks:
                types[qtype] += 1
            bar.update(len(tensors))
            use_gguf_blocks(module, blocks)
            on_blocks.update(names)
            quantized += 1
            nbytes += sum(b.numel() for b, _ in blocks)
    embed_and_head = [("token_embd.weight", model.model.embed_tokens)]
    if not tied_lm_head:
        embed_and_head.append(("output.weight", model.lm_head))
    for name, module in embed_and_head:
        tensor = raw.get(name)
        if tensor is None or int(tensor.tensor_type) not in gt.QUANTIZED_TYPES:
            continue
        qtype = int(tensor.tensor_type)
        blocks = _prefetched(prefetch, (name,), tensor.rows, tensor.n_bytes // tensor.rows)
        if blocks is None:
            blocks = _copy_blocks(file, tensor, None)
        blocks = shard_vocab_blocks(module, blocks)
        use_gguf_blocks(module, [(blocks, qtype)])
        types[qtype] += 1
        on_blocks.add(name)
        quantized += 1
        nbytes += blocks.numel()
        bar.update()
    model.load_weights(
        itertools.chain(_float_tensors(file, on_blocks, heads, bar, arch), extra_tensors)
    )
    bar.close()
    slow = sorted(gt.type_name(t) for t in types if not gt.runs_on_integer_kernels(t))
    if slow:
        logger.warning(
            "GGUF block types without an integer kernel here, dequantized a tile at a time at "
            "run time: %s",
            ", ".join(slow),
        )
    named = {gt.type_name(t): count for t, count in sorted(types.items())}
    logger.info(
        "GGUF weights: %d layers on blocks (%.0f MB; %s), %d in float",
        quantized,
        nbytes / 1e6,
        ", ".join(f"{n} x{c}" for n, c in named.items()),
        kept,
    )
    return QuantSummary(quantized, kept, nbytes, named)


def _layer_parts(layer: nn.Module) -> dict[str, tuple[str, ...]]:
    """The fused projections `layer` has (module path -> GGUF parts): a MoE layer's MLP has no
    dense gate|up and down, but may have a shared expert; an MLA layer has its own q and kv
    projections."""
    found = {}
    candidates = {**_FUSED_PARTS, **_SHARED_EXPERT_PARTS}
    if hasattr(getattr(layer, "self_attn", None), "kv_a_proj_with_mqa"):
        candidates.update(_MLA_PARTS)  # only MLA: elsewhere a q_proj's rows are fused q|k|v
    for path, parts in candidates.items():
        try:
            layer.get_submodule(path)
        except AttributeError:
            continue
        found[path] = parts
    return found


def _load_experts(
    file: _GGUFFile, experts: FusedMoE, layer_id: int
) -> tuple[list[str], list[ExpertBlocks]] | None:
    """Put a MoE layer's routed experts on the file's blocks; None when any of its three
    stacked tensors is float (then all three load as float)."""
    stacked = [f"blk.{layer_id}.{p}.weight" for p in _EXPERT_PARTS]
    if all(n in file.tensors for n in stacked):
        groups = [[n] for n in stacked]
    else:  # an older Mixtral file: blk.N.ffn_gate.E.weight, one tensor per expert
        count = experts.num_experts
        groups = [
            [f"blk.{layer_id}.{p}.{e}.weight" for e in range(count)] for p in _OLD_EXPERT_PARTS
        ]
    tensors = [[file.tensors.get(n) for n in group] for group in groups]
    for group in tensors:
        if any(t is None or int(t.tensor_type) not in gt.QUANTIZED_TYPES for t in group):
            return None
        if len({int(t.tensor_type) for t in group}) != 1:  # type: ignore[union-attr]
            return None  # experts of one projection in different types: float
    parts = [_read_expert_stack(file, group) for group in tensors]  # type: ignore[arg-type]
    gate_up, down = shard_expert_blocks(experts, parts[:2], parts[2])
    parts = [*gate_up, down]
    use_gguf_experts(experts, gate_up, down)
    return [n for group in groups for n in group], parts


def _read_expert_stack(file: _GGUFFile, tensors: list[TensorEntry]) -> ExpertBlocks:
    """One projection's experts as [experts, rows, row bytes] blocks: a stacked tensor read
    whole, or per-expert tensors read into their slots."""
    first = tensors[0]
    if len(tensors) == 1:
        count, rows = int(first.shape[2]), int(first.shape[1])  # dims fastest first
    else:
        count, rows = len(tensors), int(first.shape[1])
    stack = torch.empty(sum(t.n_bytes for t in tensors), dtype=torch.uint8)
    offset = 0
    for tensor in tensors:
        file.read_into(tensor, stack[offset : offset + tensor.n_bytes])
        offset += tensor.n_bytes
    return ExpertBlocks(stack.view(count, rows, -1), int(first.tensor_type), rows)


def _read_fused(
    file: _GGUFFile,
    tensors: list[TensorEntry],
    permute_heads: list[int | None],
    prefetch: gguf_prefetch.Prefetch | None = None,
) -> list[tuple[torch.Tensor, int]]:
    """The blocks of a fused layer's parts, each as [rows, row bytes] uint8: parts of one type
    read straight into one joined tensor (no per-part buffers to free: freed buffers under
    glibc's mmap threshold stayed in the heap, ~1.1 GB of an 8B model's load), llama.cpp's q/k
    row order undone in place. Parts `prefetch` already read are taken from it."""
    qtypes = [t.tensor_type for t in tensors]
    if len(set(qtypes)) == 1:
        rows = [t.rows for t in tensors]
        row_bytes = tensors[0].n_bytes // rows[0]
        group = tuple(t.name for t in tensors)
        joined = _prefetched(prefetch, group, sum(rows), row_bytes)
        read = joined is None
        if joined is None:
            joined = torch.empty(sum(rows), row_bytes, dtype=torch.uint8)
        pieces = list(joined.split(rows))
        result = [(joined, qtypes[0])]
        to_read = [read] * len(tensors)
    else:
        pieces, to_read = [], []
        for t in tensors:
            piece = _prefetched(prefetch, (t.name,), t.rows, t.n_bytes // t.rows)
            to_read.append(piece is None)
            pieces.append(
                piece
                if piece is not None
                else torch.empty(t.rows, t.n_bytes // t.rows, dtype=torch.uint8)
            )
        result = list(zip(pieces, qtypes, strict=True))
    for tensor, piece, heads, read in zip(tensors, pieces, permute_heads, to_read, strict=True):
        if read:
            file.read_into(tensor, piece)
        if heads is not None:
            _unpermute_rows_in_place(piece, heads)
    return result


def _prefetched(
    prefetch: gguf_prefetch.Prefetch | None, group: tuple[str, ...], rows: int, row_bytes: int
) -> torch.Tensor | None:
    """The group's blocks as a [rows, row bytes] tensor over the prefetch's memory, or None
    when the prefetch did not read them."""
    region = prefetch.region(group) if prefetch is not None else None
    if region is None or region.n_bytes != rows * row_bytes:
        return None
    assert prefetch is not None and prefetch.buffer is not None
    flat = torch.frombuffer(
        prefetch.buffer, dtype=torch.uint8, count=region.n_bytes, offset=region.offset
    )
    return flat.view(rows, row_bytes)


def _copy_blocks(file: _GGUFFile, tensor: TensorEntry, permute_heads: int | None) -> torch.Tensor:
    """A quantized tensor's blocks as a [rows, row bytes] uint8 tensor of its own."""
    blocks = file.read(tensor)
    if permute_heads is not None:
        _unpermute_rows_in_place(blocks, permute_heads)
    return blocks


def _unpermute_rows_in_place(blocks: torch.Tensor, num_heads: int) -> None:
    """unpermute_qk on whole rows of blocks (exact: each row is a run of whole blocks), one head
    at a time so the only temporary is one head's rows. Copied by numpy: each torch copy_ of
    a head's rows is an OpenMP region, and on a busy machine its barrier waited on a thread
    another process held: ~3 ms a head, 2-4 s of a 1B model's load (numpy: 13 ms in all)."""
    for head in np.split(blocks.numpy(), num_heads):
        head[...] = unpermute_qk(head, 1)


def _float_tensors(
    file: _GGUFFile, on_blocks: set[str], heads: dict[str, int], bar: tqdm, arch: str
) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named float tensors of everything not kept on blocks."""
    for name, tensor in file.tensors.items():
        if name in on_blocks:
            continue
        bar.update()
        hf_name = hf_tensor_name(name, arch)
        if hf_name is None:
            continue
        shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists dims fastest first
        value = dequantize(file.read(tensor).reshape(-1), int(tensor.tensor_type), shape)
        value = hf_float_value(arch, hf_name, value)
        part = name.split(".")[-2] if name.startswith("blk.") else ""
        if part in heads:
            value = torch.from_numpy(np.ascontiguousarray(unpermute_qk(value.numpy(), heads[part])))
        yield hf_name, value
