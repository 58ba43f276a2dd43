"""`--dtype auto` on the CPU: bfloat16 only where the CPU has BF16 units and bfloat16 measurably
beats float32 on this machine; float32 otherwise. The reason is logged at startup.

The flags (AVX512-BF16, AMX-BF16) only nominate bfloat16. A child process
(radixserve.kernels.bf16_probe) then runs the model's own matmul in both dtypes: a path that
dies (an illegal instruction), returns wrong results, or is not at least MIN_GAIN faster keeps
float32. The verdict is cached per CPU and torch version, so later starts skip the probe.
"""

from __future__ import annotations

import functools
import json
import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from radixserve.utils.cache_dir import radixserve_cache_dir

logger = logging.getLogger(__name__)

MIN_GAIN = 1.15  # float32 time over bfloat16 time needed to switch
MAX_REL_ERROR = 2e-2  # of the bf16 matmul against float64 (bf16 rounding gives ~3e-3)
PROBE_TIMEOUT_S = 300
PROBE_MODULE = "radixserve.kernels.bf16_probe"


@dataclass(frozen=True)
class DtypeChoice:
    dtype: str  # "bfloat16" or "float32"
    reason: str


def judge(measured: dict[str, float]) -> DtypeChoice:
    """The choice from the probe's figures."""
    err = measured["bf16_rel_err"]
    if not err <= MAX_REL_ERROR:
        return DtypeChoice("float32", f"the bfloat16 matmul was inaccurate (rel. error {err:.2g})")
    gain = measured["float32_s"] / measured["bfloat16_s"]
    verdict = f"bfloat16 matmuls measured {gain:.2f}x float32's speed"
    if gain < MIN_GAIN:
        return DtypeChoice("float32", f"{verdict} (needs {MIN_GAIN}x)")
    return DtypeChoice("bfloat16", verdict)


def _cache_file(fingerprint: str) -> Path:
    # The installed version from its metadata: importing torch here would make option parsing
    # (which resolves --dtype auto) import it on every CPU with BF16 units.
    from importlib.metadata import PackageNotFoundError, version

    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "unknown"
    return radixserve_cache_dir() / f"auto-dtype-{fingerprint}-torch{torch_version}.json"


def _probe() -> DtypeChoice:
    proc = subprocess.run(
        [sys.executable, "-m", PROBE_MODULE],
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_S,
        check=False,
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        return DtypeChoice(
            "float32", f"the bfloat16 probe failed (exit {proc.returncode}: {tail[0]})"
        )
    return judge(json.loads(proc.stdout.strip().splitlines()[-1]))


@functools.cache
def cpu_auto_dtype() -> DtypeChoice:
    """What `--dtype auto` means on this CPU (probed once per CPU, then cached on disk); the
    choice and its reason are logged once per process."""
    choice = _choose()
    logger.info("--dtype auto on this CPU: %s (%s)", choice.dtype, choice.reason)
    return choice


def _choose() -> DtypeChoice:
    from radixserve.kernels.cpu_features import cpu_features

    features = cpu_features()
    present = features.bf16_flags
    if not present:
        return DtypeChoice("float32", "the CPU has no BF16 units (avx512_bf16, amx_bf16)")
    cache = _cache_file(features.fingerprint)
    try:
        saved = json.loads(cache.read_text())
        return DtypeChoice(saved["dtype"], saved["reason"])
    except (OSError, ValueError, KeyError):
        pass
    try:
        choice = _probe()
    except (OSError, subprocess.TimeoutExpired) as exc:
        choice = DtypeChoice("float32", f"the bfloat16 probe failed ({type(exc).__name__})")
    choice = DtypeChoice(choice.dtype, f"CPU has {', '.join(present)}; {choice.reason}")
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"dtype": choice.dtype, "reason": choice.reason}))
    except OSError:
        pass  # an unwritable cache only means probing again next start
    return choice
