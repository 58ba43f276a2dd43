"""utils.heap: idle loops hand freed heap memory back to the OS, at a bounded rate."""

from __future__ import annotations

import pytest

from radixserve.utils import heap


def test_release_free_heap_reports_whether_it_could() -> None:
    # glibc on the machines this runs on; elsewhere the call must be a harmless no-op.
    assert heap.release_free_heap() is (heap._malloc_trim() is not None)


def test_idle_release_once_per_burst_of_work(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(heap, "release_free_heap", lambda: calls.append(1) or True)
    now = [100.0]
    monkeypatch.setattr(heap.time, "monotonic", lambda: now[0])
    release = heap.IdleHeapRelease(min_interval_s=10.0)

    assert release.observe(busy=False)  # the first idle moment follows the model load
    assert not release.observe(busy=False)  # still idle, nothing new freed
    assert not release.observe(busy=True)
    now[0] += 1.0
    assert not release.observe(busy=False)  # work again, but within the interval
    now[0] += 10.0
    assert release.observe(busy=False)  # the interval passed: the pending release happens
    assert not release.observe(busy=False)
    assert len(calls) == 2
