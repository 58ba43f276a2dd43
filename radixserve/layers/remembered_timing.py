"""Start-up kernel choices made by timing (layers/kquant_paths.py, layers/fast_path.py's int4
choice), remembered so a later start with the same inputs reuses the figures instead of timing
again (~0.2-0.5 s of a GGUF model's start-up on 2 cores).

The figures are remembered, not the choice: the thresholds applied to them stay in the code.
A record is named by a hash of the kernel build (its name covers the CPU and the kernels'
sources), torch's version and thread count, the caller's own inputs (the timed layer's block
type and shape) and a version, so another CPU, kernel, thread count or model shape times again.

Only figures timed while the timing had its cores are remembered: the process's CPU time over
the timing must be MIN_CPU_SHARE of its wall time times torch's threads. On 2 cores, another
busy process brought that share to 0.56-0.68 and the figures with it (the int8 gain measured
1.03x and 4.7x where quiet runs give 1.8-1.9x); at 0.97-1.0 quiet, and 0.92-0.97 beside a
niced busy process (the API process's start-up threads run niced), they held. Figures from a
busy machine are used for that start and timed again next start.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch

from radixserve.utils.startup_cache import key_of, read_record, write_record

logger = logging.getLogger(__name__)

FORMAT = "1"
MIN_CPU_SHARE = 0.85


def remembered_figures(
    kind: str,
    ext: object,
    inputs: Sequence[str],
    measure: Callable[[], dict[str, float]],
) -> tuple[dict[str, float], str]:
    """`measure()`'s figures, or an earlier start's for the same inputs; with a note for the
    log saying which ("measured", "remembered from an earlier start", or why not kept)."""
    threads = torch.get_num_threads()
    parts = [FORMAT, getattr(ext, "__name__", ""), torch.__version__, str(threads), *inputs]
    key = key_of(parts)
    record = read_record(kind, key)
    figures = record.get("figures") if record is not None else None
    if isinstance(figures, dict) and all(isinstance(v, int | float) for v in figures.values()):
        return dict(figures), "remembered from an earlier start"
    cpu, wall = time.process_time(), time.monotonic()
    figures = measure()
    share = cpu_share(time.process_time() - cpu, time.monotonic() - wall, threads)
    if share < MIN_CPU_SHARE:
        return figures, f"the timing had {share:.0%} of its cores: not remembered"
    write_record(kind, key, {"figures": figures})
    return figures, "measured"


def cpu_share(cpu_s: float, wall_s: float, threads: int) -> float:
    """The share of `threads` cores over `wall_s` seconds that `cpu_s` of CPU time fills."""
    return cpu_s / max(wall_s * max(threads, 1), 1e-9)
