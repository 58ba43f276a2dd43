"""Ctrl-C while the server loads: a terminal sends SIGINT to the whole foreground process group
(the server and its children). The server must stop at once with one line and status 130, no
traceback from any process, and no child left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.e2e.e2e_server import BASE_ARGS, REPO, free_port


def _restore_sigint() -> None:
    # Run as a terminal's foreground job: its own process group, SIGINT at its default (a
    # shell's background job would start with SIGINT ignored).
    os.setpgrp()
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_while_loading_exits_quietly_with_130() -> None:
    command = [sys.executable, "-m", "radixserve", "serve", "--port", str(free_port())]
    proc = subprocess.Popen(
        [*command, *BASE_ARGS[:-2], "--log-level", "info"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_restore_sigint,
    )
    assert proc.stdout is not None
    lines = []
    deadline = time.monotonic() + 300
    # Interrupt once the scheduler process is up and loading the model.
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "CPU threads" in line or "Loaded" in line:
            break
    os.killpg(proc.pid, signal.SIGINT)
    try:
        rest, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("the server did not stop within 60 s of Ctrl-C") from None
    output = "".join(lines) + rest
    assert proc.returncode == 130, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    assert "radixserve serve: interrupted" in output
    # Children stop with the parent (shutdown, else the parent-death signal): none may linger.
    stop_by = time.monotonic() + 20
    while time.monotonic() < stop_by:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError("a process of the server's group still ran 20 s after Ctrl-C")
