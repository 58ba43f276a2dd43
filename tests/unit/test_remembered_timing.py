"""Kernel-path timings remembered across starts (layers/remembered_timing.py): reused for the
same kernel build, threads and inputs, timed again otherwise, and never remembered when other
work held the CPUs during the timing (utils/cpu_pressure.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixserve.layers import remembered_timing
from radixserve.utils.cache_dir import CACHE_DIR_ENV
from radixserve.utils.cpu_pressure import StallMeter


class _Ext:
    __name__ = "radixserve_cpu_abc_123"


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))


def _quiet(monkeypatch: pytest.MonkeyPatch, share: float | None) -> None:
    monkeypatch.setattr(StallMeter, "share", lambda self: share)


def test_figures_are_remembered_for_the_same_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    _quiet(monkeypatch, 0.0)
    calls: list[int] = []

    def measure() -> dict[str, float]:
        calls.append(1)
        return {"gain": 1.5 + len(calls)}

    first = remembered_timing.remembered_figures("k", _Ext(), ["Q4_K", "64x144"], measure)
    assert first == ({"gain": 2.5}, "measured")
    again = remembered_timing.remembered_figures("k", _Ext(), ["Q4_K", "64x144"], measure)
    assert again == ({"gain": 2.5}, "remembered from an earlier start")
    other = remembered_timing.remembered_figures("k", _Ext(), ["Q4_K", "128x144"], measure)
    assert other == ({"gain": 3.5}, "measured")
    assert len(calls) == 2


def test_another_kernel_build_or_thread_count_times_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    _quiet(monkeypatch, None)  # no pressure information: remembered, as --dtype auto's probe
    remembered_timing.remembered_figures("k", _Ext(), ["x"], lambda: {"gain": 1.0})

    class Rebuilt:
        __name__ = "radixserve_cpu_abc_456"

    rebuilt = remembered_timing.remembered_figures("k", Rebuilt(), ["x"], lambda: {"gain": 2.0})
    assert rebuilt == ({"gain": 2.0}, "measured")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 99)
    assert remembered_timing.remembered_figures("k", _Ext(), ["x"], lambda: {"gain": 3.0}) == (
        {"gain": 3.0},
        "measured",
    )


def test_a_busy_machines_figures_are_used_once(monkeypatch: pytest.MonkeyPatch) -> None:
    _quiet(monkeypatch, 0.4)
    figures, note = remembered_timing.remembered_figures("k", _Ext(), ["x"], lambda: {"gain": 0.8})
    assert figures == {"gain": 0.8} and "busy 40%" in note and "not remembered" in note
    _quiet(monkeypatch, 0.0)
    assert remembered_timing.remembered_figures("k", _Ext(), ["x"], lambda: {"gain": 1.9}) == (
        {"gain": 1.9},
        "measured",
    )


def test_the_stall_meter_reads_the_pressure_file(tmp_path: Path) -> None:
    pressure = tmp_path / "cpu"
    pressure.write_text("some avg10=1.00 avg60=1.00 avg300=1.00 total=1000000\n")
    meter = StallMeter(pressure).start()
    pressure.write_text("some avg10=1.00 avg60=1.00 avg300=1.00 total=1000000\n")
    assert meter.share() == 0.0
    pressure.write_text("some avg10=1.00 avg60=1.00 avg300=1.00 total=999999999\n")
    share = meter.share()
    assert share is not None and share > 1.0  # a second of stall within microseconds
    assert StallMeter(tmp_path / "absent").start().share() is None
