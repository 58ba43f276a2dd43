"""--dtype auto on the CPU: BF16 flags only nominate bfloat16; a probe in a child process must
measure it faster than float32 (and accurate) before it is chosen. A probe that dies keeps
float32, and the verdict is cached per CPU."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from radixserve.kernels import cpu_features as features_module
from radixserve.utils import auto_dtype
from radixserve.utils.auto_dtype import MIN_GAIN, DtypeChoice, judge


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Not XDG_CACHE_HOME: the child would look for (and rebuild) the C++ kernels there too.
    monkeypatch.setattr(auto_dtype, "_cache_file", lambda key: tmp_path / f"auto-dtype-{key}")
    auto_dtype.cpu_auto_dtype.cache_clear()


def claim_flags(monkeypatch: pytest.MonkeyPatch, *flags: str) -> None:
    cpu = features_module.CpuFeatures("Test CPU", frozenset({"avx2", *flags}))
    monkeypatch.setattr(features_module, "cpu_features", lambda: cpu)


def test_judge() -> None:
    fast = {"float32_s": 2.0, "bfloat16_s": 1.0, "bf16_rel_err": 3e-3}
    assert judge(fast).dtype == "bfloat16" and "2.00x" in judge(fast).reason
    slow = {**fast, "bfloat16_s": 1.9}
    assert judge(slow).dtype == "float32" and "needs" in judge(slow).reason
    wrong = {**fast, "bf16_rel_err": 0.5}
    assert judge(wrong).dtype == "float32" and "inaccurate" in judge(wrong).reason
    nan = {**fast, "bf16_rel_err": float("nan")}
    assert judge(nan).dtype == "float32"


def test_no_bf16_units_means_float32_without_probing(monkeypatch: pytest.MonkeyPatch) -> None:
    claim_flags(monkeypatch)

    def no_probe() -> DtypeChoice:
        raise AssertionError("probed a CPU without BF16 units")

    monkeypatch.setattr(auto_dtype, "_probe", no_probe)
    choice = auto_dtype.cpu_auto_dtype()
    assert choice.dtype == "float32" and "no BF16 units" in choice.reason


def test_flags_are_checked_by_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real probe, in a child: whatever this machine is, the choice follows the figures it
    measured (on a CPU without BF16 units bfloat16 is emulated and loses)."""
    claim_flags(monkeypatch, "avx512_bf16")
    choice = auto_dtype.cpu_auto_dtype()
    assert choice.reason.startswith("CPU has avx512_bf16; ")
    measured = re.search(r"measured ([0-9.]+)x", choice.reason)
    assert measured is not None, choice.reason
    assert (choice.dtype == "bfloat16") == (float(measured.group(1)) >= MIN_GAIN)
    if not {"avx512_bf16", "amx_bf16"} & set(Path("/proc/cpuinfo").read_text().split()):
        assert choice.dtype == "float32"  # emulated bfloat16 never wins
    # Cached per CPU: the next process (here: after clearing the in-process cache) reuses it.
    auto_dtype.cpu_auto_dtype.cache_clear()

    def no_probe() -> DtypeChoice:
        raise AssertionError("probed again")

    monkeypatch.setattr(auto_dtype, "_probe", no_probe)
    assert auto_dtype.cpu_auto_dtype() == choice


def test_a_probe_that_dies_keeps_float32(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "dies_with_sigill.py").write_text(
        "import os, signal\nos.kill(os.getpid(), signal.SIGILL)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(auto_dtype, "PROBE_MODULE", "dies_with_sigill")
    claim_flags(monkeypatch, "amx_bf16")
    choice = auto_dtype.cpu_auto_dtype()
    assert choice.dtype == "float32"
    assert "probe failed (exit -4" in choice.reason
