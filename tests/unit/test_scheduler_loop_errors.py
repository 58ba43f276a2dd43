"""A failing scheduler step aborts the batch with a message that carries an error id, and the
log line with the traceback carries the same id (no internals in what clients see)."""

from __future__ import annotations

import logging
import re

import pytest

from radixserve.managers.scheduler_loop import SchedulerLoop


class FailingScheduler:
    def __init__(self) -> None:
        self.failed_with: list[str] = []

    def step_and_stash(self) -> None:
        raise RuntimeError("boom at /secret/host/path.py")

    def fail_all(self, message: str) -> None:
        self.failed_with.append(message)


def test_step_failure_reports_an_error_id_found_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    scheduler = FailingScheduler()
    loop = SchedulerLoop(scheduler, lambda _t: [], lambda _m: None)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR):
        loop._step()
    (message,) = scheduler.failed_with
    match = re.search(r"request id (err-[0-9a-f]{16})", message)
    assert match is not None, message
    assert "/secret" not in message and "boom" not in message
    logged = [r for r in caplog.records if match.group(1) in r.getMessage()]
    assert logged and logged[0].exc_info is not None
