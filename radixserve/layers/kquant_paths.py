"""Which kernels run --quantization gguf's K-quant layers (Q3_K..Q6_K), chosen once per process
at startup by measurement on the model's own largest K-quant layer, and logged.

- A few activation rows (decode): int8 activations per 256 (llama.cpp's Q8_K,
  csrc/gguf_q8k.cpp) or int16 ones per 32 (csrc/gguf_kquant.cpp: ~1e-5 relative error per
  matmul instead of ~5e-3).
- Many rows (prefill, large decode batches): the Q8_K panel GEMM (csrc/gguf_q8k_panel.cpp:
  weight panels decoded once for all rows, vpdpbusd where the CPU has VNNI) or float tiles over
  dequantized panels (csrc/gguf_gemm_tiled.cpp, exact in x).
- Where the CPU and the OS allow AMX-INT8 (q8k_isa "amx_int8"), the panel GEMM on tiles
  (csrc/gguf_q8k_amx.cpp) from AMX_MIN_ROWS or AMX_AFTER_MID_BATCHES rows, where it measures
  faster than the vpdpbusd panel (its panels cost more to decode, so it wins only with many
  rows). All of these give a row the same bits.

RADIXSERVE_GGUF_KQUANT_INT8: "auto" takes each int8 path where it measures KQUANT_INT8_MIN_GAIN
faster (per-row kernels at 1 and 3 rows, the panel at 8 and 64), "1" both always, "0" never.
The two int8 paths give a row the same bits whatever batch it is in.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch
from torch import nn

from radixserve.kernels import ops
from radixserve.kernels.build import load_extension
from radixserve.kernels.gguf_types import row_weights
from radixserve.layers.quantization import GGUFWeight, MethodLayer
from radixserve.layers.remembered_timing import remembered_figures
from radixserve.layers.timing import interleaved_fastest

logger = logging.getLogger(__name__)

KQUANT_INT8_ENV = "RADIXSERVE_GGUF_KQUANT_INT8"
KQUANT_INT8_MIN_GAIN = 1.1
# From this many rows the panel GEMM runs when it wins at 8 rows (it measured even with the
# per-row kernels at 4 rows with AVX512-VNNI, ahead from 8).
PANEL_MIN_ROWS = 4
PANEL_AFTER_SMALL_BATCHES = 16  # where it wins only at 64 rows
PANEL_NEVER = 2**62
PANEL_PROBE_COLUMNS = 2048  # output rows of the layer the panel is timed on (not the LM head's 49k)
AMX_ISA = "amx_int8"
AMX_MIN_ROWS = 64  # where the tiles win at 64 rows (1.2-1.3x on Sapphire Rapids, 2x at 512)
AMX_AFTER_MID_BATCHES = 128  # where they win only at 128


def choose_kquant_paths(
    model: nn.Module, linears: tuple[type, ...], enabled: bool, deterministic: bool = False
) -> bool:
    """Set the process-wide K-quant paths for `model` and log them with the reason. Returns
    whether int8 activations were chosen for a few rows. Under `deterministic` inference
    "auto" decides by a CPU fact instead of a timing (int8 where the CPU has VNNI): a timed
    choice could differ between starts, or between tensor-parallel ranks timing their halves of
    a layer, and the two formats round differently."""
    from radixserve.kernels.gguf_types import Q8K_TYPES

    ext = load_extension()
    if ext is None:
        return False
    ext.set_kquant_int8(False)
    ext.set_q8k_panel_min_rows(PANEL_NEVER)
    ext.set_q8k_isa(_vector_isa(ext))
    held = [
        m.quant_method.gguf_weight()
        for m in model.modules()
        if isinstance(m, linears) and isinstance(m, MethodLayer)
    ]
    parts = [
        part
        for weight in held
        if weight is not None
        for part in weight.pieces()
        if part.qtype in Q8K_TYPES
    ]
    mode = os.environ.get(KQUANT_INT8_ENV, "auto")
    fixed_rule = ""
    if deterministic and mode == "auto":
        mode = "1" if _has_vnni(ext) else "0"
        fixed_rule = "deterministic inference: int8 where the CPU has VNNI, else int16"
    if not enabled or not parts or mode == "0":
        if parts and mode == "0":
            logger.info(
                "GGUF K-quants on int16 activations and float tiles (%s)",
                fixed_rule or f"{KQUANT_INT8_ENV}=0",
            )
        return False
    amx_rows = PANEL_NEVER
    if mode == "1":
        small, min_rows = True, PANEL_MIN_ROWS
        reason = fixed_rule or f"{KQUANT_INT8_ENV}=1"
        amx_rows = AMX_MIN_ROWS if AMX_ISA in ext.q8k_isas() else PANEL_NEVER
    else:
        largest = max(parts, key=lambda p: p.blocks.numel())
        figures, note = remembered_figures(
            "kquant-paths", ext, _timing_inputs(largest), lambda: _measure(ext, largest)
        )
        gain, min_rows = figures["int8_gain"], int(figures["panel_min_rows"])
        small = gain >= KQUANT_INT8_MIN_GAIN
        amx_rows = int(figures.get("amx_min_rows", PANEL_NEVER))
        reason = f"int8 measured {gain:.2f}x the int16 kernels' speed at 1-3 rows; {note}"
    ext.set_kquant_int8(small)
    ext.set_q8k_panel_min_rows(min_rows)
    if amx_rows != PANEL_NEVER:
        ext.set_q8k_isa(AMX_ISA)
        ext.set_q8k_amx_min_rows(amx_rows)
    few = "int8 activations per 256 (Q8_K, as llama.cpp)" if small else "int16 activations"
    many = (
        "float tiles (the Q8_K panel GEMM measured no faster)"
        if min_rows == PANEL_NEVER
        else f"the Q8_K panel GEMM ({_vector_isa(ext)}) from {min_rows} rows"
    )
    if amx_rows != PANEL_NEVER:
        many += f", on AMX-INT8 tiles from {amx_rows} rows"
    elif min_rows != PANEL_NEVER and AMX_ISA in ext.q8k_isas():
        many += " (AMX-INT8 tiles measured no faster)"
    logger.info("GGUF K-quants: %s for a few rows (%s), %s", few, reason, many)
    return small


def _has_vnni(ext: object) -> bool:
    """Whether the Q8_K kernels have a VNNI variant here (avx512_vnni or amx_int8)."""
    return any(isa != "avx2" for isa in ext.q8k_isas())


def _vector_isa(ext: object) -> str:
    """The widest Q8_K variant without tiles: the default, and amx_int8's kernels for few rows."""
    return [isa for isa in ext.q8k_isas() if isa != AMX_ISA][-1]


def _timing_inputs(weight: GGUFWeight) -> list[str]:
    """What the figures of _measure depend on besides the kernel build and thread count."""
    shape = "x".join(str(d) for d in weight.blocks.shape)
    constants = (
        f"{KQUANT_INT8_MIN_GAIN}|{PANEL_MIN_ROWS}|{PANEL_AFTER_SMALL_BATCHES}"
        f"|{AMX_MIN_ROWS}|{AMX_AFTER_MID_BATCHES}"
    )
    return [str(weight.qtype), shape, str(PANEL_PROBE_COLUMNS), constants]


def _measure(ext: object, weight: GGUFWeight) -> dict[str, float]:
    """The int8 per-row kernels' gain, then (with them chosen or not, as they will run) from
    how many rows the panel GEMM wins, and from how many it wins on AMX tiles (where this
    machine has them and the panel runs at all)."""
    gain = _small_batch_int8_gain(ext, weight)
    ext.set_kquant_int8(gain >= KQUANT_INT8_MIN_GAIN)
    min_rows = _panel_min_rows(ext, weight)
    figures = {"int8_gain": gain, "panel_min_rows": min_rows}
    if min_rows != PANEL_NEVER and AMX_ISA in ext.q8k_isas():
        figures["amx_min_rows"] = _amx_min_rows(ext, weight)
    return figures


def _small_batch_int8_gain(ext: object, weight: GGUFWeight, rounds: int = 5) -> float:
    """The int16 kernels' time over the int8 per-row kernels' on `weight`, at 1
    and 3 rows (whole layer: batch 1 reads it from memory)."""
    x_rows = [torch.randn(rows, _in_features(weight)) for rows in (1, 3)]

    def call(x: torch.Tensor, int8: bool) -> None:
        ext.set_kquant_int8(int8)
        ops.gguf_linear(x, weight.blocks, weight.qtype, weight.out_features)

    total = {"int16": 0.0, "int8": 0.0}
    for x in x_rows:
        fastest = interleaved_fastest(
            {"int16": lambda x=x: call(x, False), "int8": lambda x=x: call(x, True)}, rounds
        )
        for name, seconds in fastest.items():
            total[name] += seconds
    ext.set_kquant_int8(False)
    return total["int16"] / max(total["int8"], 1e-9)


def _panel_min_rows(ext: object, weight: GGUFWeight, rounds: int = 5) -> int:
    """From how many rows the panel GEMM should run: PANEL_MIN_ROWS where it beats the path it
    replaces at 8 rows too, PANEL_AFTER_SMALL_BATCHES where it beats the float tiles only at 64
    rows, else PANEL_NEVER."""
    probe = _Probe(weight)

    def call(x: torch.Tensor, min_rows: int) -> None:
        ext.set_q8k_panel_min_rows(min_rows)
        probe.run(x)

    try:
        return probe.min_rows(
            ((64, PANEL_AFTER_SMALL_BATCHES), (8, PANEL_MIN_ROWS)),
            ("other", lambda x: call(x, PANEL_NEVER)),
            ("panel", lambda x: call(x, 1)),
            rounds,
        )
    finally:
        ext.set_q8k_panel_min_rows(PANEL_NEVER)


def _amx_min_rows(ext: object, weight: GGUFWeight, rounds: int = 5) -> int:
    """From how many rows the panel GEMM should run on AMX tiles: AMX_MIN_ROWS where they beat
    the vpdpbusd panel at 64 rows, AMX_AFTER_MID_BATCHES where only at 128, else PANEL_NEVER.
    Leaves the vector variant selected."""
    probe = _Probe(weight)
    vector = _vector_isa(ext)

    def call(x: torch.Tensor, isa: str) -> None:
        ext.set_q8k_isa(isa)
        probe.run(x)

    ext.set_q8k_panel_min_rows(1)
    ext.set_q8k_amx_min_rows(1)
    try:
        return probe.min_rows(
            ((AMX_AFTER_MID_BATCHES, AMX_AFTER_MID_BATCHES), (64, AMX_MIN_ROWS)),
            ("vector", lambda x: call(x, vector)),
            ("amx", lambda x: call(x, AMX_ISA)),
            rounds,
        )
    finally:
        ext.set_q8k_isa(vector)
        ext.set_q8k_panel_min_rows(PANEL_NEVER)


class _Probe:
    """The first PANEL_PROBE_COLUMNS output rows of `weight`, timed against two ways of running
    them (the panel's row-count choices)."""

    def __init__(self, weight: GGUFWeight) -> None:
        self.n = min(weight.out_features, PANEL_PROBE_COLUMNS)
        self.blocks = weight.blocks[: self.n].contiguous()
        self.qtype = weight.qtype
        self.k = _in_features(weight)

    def run(self, x: torch.Tensor) -> None:
        ops.gguf_linear(x, self.blocks, self.qtype, self.n)

    def min_rows(
        self,
        probes: tuple[tuple[int, int], ...],
        base: tuple[str, Callable[[torch.Tensor], None]],
        candidate: tuple[str, Callable[[torch.Tensor], None]],
        rounds: int,
    ) -> int:
        """Probes (rows, row count to choose) from most rows to fewest: each where `candidate`
        is KQUANT_INT8_MIN_GAIN faster than `base` lowers the choice to its row count; the first
        where it is not ends the walk. PANEL_NEVER where it wins at none."""
        chosen = PANEL_NEVER
        for rows, min_rows in probes:
            x = torch.randn(rows, self.k)
            fastest = interleaved_fastest(
                {base[0]: lambda x=x: base[1](x), candidate[0]: lambda x=x: candidate[1](x)},
                rounds,
            )
            if fastest[base[0]] < KQUANT_INT8_MIN_GAIN * fastest[candidate[0]]:
                break
            chosen = min_rows
        return chosen


def _in_features(weight: GGUFWeight) -> int:
    return row_weights(weight.qtype, weight.blocks.shape[1])
