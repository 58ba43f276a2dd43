"""Kernel-path timings remembered across starts (layers/remembered_timing.py): reused for the
same kernel build, threads and inputs, timed again otherwise, and never remembered when the
timing did not get its cores."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixserve.layers import remembered_timing
from radixserve.utils.cache_dir import CACHE_DIR_ENV


class _Ext:
    __name__ = "radixserve_cpu_abc_123"


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))


def _quiet(monkeypatch: pytest.MonkeyPatch, share: float) -> None:
    """The timing gets `share` of its cores."""
    monkeypatch.setattr(remembered_timing, "cpu_share", lambda cpu, wall, threads: share)


def test_figures_are_remembered_for_the_same_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    _quiet(monkeypatch, 1.0)
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

    _quiet(monkeypatch, 0.97)
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
    _quiet(monkeypatch, 0.6)
    figures, note = remembered_timing.remembered_figures("k", _Ext(), ["x"], lambda: {"gain": 0.8})
    assert figures == {"gain": 0.8} and "60% of its cores" in note and "not remembered" in note
    _quiet(monkeypatch, 0.95)
    assert remembered_timing.remembered_figures("k", _Ext(), ["x"], lambda: {"gain": 1.9}) == (
        {"gain": 1.9},
        "measured",
    )


def test_the_cpu_share_of_a_timing() -> None:
    assert remembered_timing.cpu_share(2.0, 1.0, 2) == 1.0
    assert remembered_timing.cpu_share(1.2, 1.0, 2) == 0.6
    assert remembered_timing.cpu_share(1.0, 0.0, 1) > 1  # no time passed: never "too busy"
