"""Start-up kernel choices made by timing (layers/kquant_paths.py, layers/fast_path.py's int4
choice), remembered so a later start with the same inputs reuses the figures instead of timing
again (~0.2-0.5 s of a GGUF model's start-up on 2 cores).

The figures are remembered, not the choice: the thresholds applied to them stay in the code.
A record is named by a hash of the kernel build (its name covers the CPU and the kernels'
sources), torch's version and thread count, the caller's own inputs (the timed layer's block type and
shape) and a version, so another CPU, kernel, thread count or model shape times again. Only
figures timed while no task waited for a CPU are remembered (utils/cpu_pressure.py); a busy
machine's are used once and timed again next start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

from radixserve.utils.cpu_pressure import StallMeter
from radixserve.utils.startup_cache import key_of, read_record, write_record

logger = logging.getLogger(__name__)

FORMAT = "1"
# Timings during which runnable tasks waited this share of the time or more are not remembered.
MAX_STALL_SHARE = 0.05


def remembered_figures(
    kind: str,
    ext: object,
    inputs: Sequence[str],
    measure: Callable[[], dict[str, float]],
) -> tuple[dict[str, float], str]:
    """`measure()`'s figures, or an earlier start's for the same inputs; with a note for the
    log saying which ("measured", "remembered from an earlier start", or why not kept)."""
    threads = str(torch.get_num_threads())
    parts = [FORMAT, getattr(ext, "__name__", ""), torch.__version__, threads, *inputs]
    key = key_of(parts)
    record = read_record(kind, key)
    figures = record.get("figures") if record is not None else None
    if isinstance(figures, dict) and all(isinstance(v, int | float) for v in figures.values()):
        return dict(figures), "remembered from an earlier start"
    meter = StallMeter().start()
    figures = measure()
    stalled = meter.share()
    if stalled is not None and stalled >= MAX_STALL_SHARE:
        return figures, f"CPUs busy {stalled:.0%} of the timing: not remembered"
    write_record(kind, key, {"figures": figures})
    return figures, "measured"
