"""Interrupts at the worst moments (hardening round 3): while the embedded Ray starts, twice in a row, and
during `ddpsweep calibrate`. Each ends with one message, the right exit code, no traceback, and no process
of the driver's Ray left running."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweeps.driver import machine
from tests.test_cli_sweep import SMOKE, ddpsweep

ROOT = Path(__file__).resolve().parent.parent


def wait_for_ray(pid: int, timeout_s: float = 120) -> None:
    """Until the driver `pid` has started its embedded Ray (a process names its session folder)."""
    deadline = time.monotonic() + timeout_s
    while not machine.session_processes(pid):
        assert time.monotonic() < deadline, "the embedded Ray never started"
        time.sleep(0.05)


def assert_nothing_left(pid: int) -> None:
    deadline = time.monotonic() + 3
    while machine.session_processes(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [" ".join(p.cmdline())[:120] for p in machine.session_processes(pid)]
    assert left == [], left


@pytest.mark.ray
@pytest.mark.parametrize(("signals", "code"), [([signal.SIGINT, signal.SIGINT], 130), ([signal.SIGTERM], 143)])
def test_an_interrupt_while_ray_starts_ends_cleanly(tmp_path, signals, code):
    proc = ddpsweep("run", str(SMOKE), "--results", str(tmp_path), "--sweep", "early")
    wait_for_ray(proc.pid)
    for sig in signals:  # Ctrl-C twice, 0.3 s apart: the second one arrives while Ray starts or shuts down
        proc.send_signal(sig)
        time.sleep(0.3)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err[-3000:]  # it was 139 (a segfault at exit) or 15 (Ray's own handler)
    assert "Traceback" not in err and "SIGTERM received" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == "interrupted before the sweep started measuring; nothing was written"
    assert_nothing_left(proc.pid)  # Ray's agents stayed for a minute or more


@pytest.mark.ray
def test_ctrl_c_during_calibrate_says_so_and_exits_130(tmp_path):
    proc = ddpsweep("calibrate", str(SMOKE), "--results", str(tmp_path))
    wait_for_ray(proc.pid)
    time.sleep(8)  # into the worker group's start
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]  # it exited 0 and printed the rows hint as if it had finished
    assert "interrupted: calibration stopped" in err and "Traceback" not in err
    assert "rows: ddpsweep query" not in out
    assert_nothing_left(proc.pid)


@pytest.mark.parametrize(("code", "ends_at_once"), [(130, True), (143, True), (2, False)])
def test_after_an_interrupt_no_thread_left_behind_holds_the_exit(code, ends_at_once):
    """An interrupted command exits with its code though a non-daemon thread still runs (a Ray or Tune thread
    once held a Ctrl-C'd sweep's exit past 120 s in CI); any other exit still waits for it as Python does."""
    script = (
        "import sys, threading, time; import service.cli as cli\n"
        "threading.Thread(target=time.sleep, args=(8,)).start()\n"
        f"cli.app = lambda: sys.exit({code})\n"
        "cli.main()\n"
    )
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    took = time.monotonic() - start
    assert done.returncode == code, done.stderr[-2000:]
    assert (took < 6) is ends_at_once, took  # the thread sleeps 8 s


def test_a_sigterm_whose_exception_was_swallowed_still_ends_the_sweeps_loop(monkeypatch):
    """Ray's C++ wait loop turns the handler's exception into a status; once a sweep ran to the end after a
    SIGTERM and exited 0. The flag the handler sets ends Tune's loop at its next step."""
    from sweeps.driver import session
    from sweeps.driver.runner import RowWriter

    monkeypatch.setattr(session, "_TERMINATED", [])
    monkeypatch.setattr(session, "_SIGTERM_WANTED", [])
    writer = RowWriter(None, None, None, [])
    writer.on_step_begin(0, [])  # no signal: the loop goes on
    before = signal.getsignal(signal.SIGTERM)
    try:
        session.raise_on_sigterm()
        with contextlib.suppress(session.Terminated):  # swallowed on its way out, as in Ray's wait loop
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert session.terminated()
    with pytest.raises(session.Terminated):
        writer.on_step_begin(1, [])
