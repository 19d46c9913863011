"""Ctrl-C drains what already arrived: the releases sitting in the scheduler's receive buffers
when the driver gets SIGINT are recorded, nothing else is, and a rerun does not redo them.

A real driver (``tests/workers/drainprog.py``) runs 400 blocks of 20 ms on 8 worker functions,
each a fake ``sbatch --wait`` (``tests/workers/fakebatch.py``) whose job, in its own session as
on another node, runs a ``Client`` loop. Each job marks a block finished (``fin1_<id>``) at the
end of its body and released (``sent1_<id>``) once its release frame has been sent. The test
stops the driver's process group (SIGSTOP), waits until the jobs have sent what they can (each
finishes the block it runs and the one sent ahead, then waits for an answer), sends SIGINT to the
group (as a terminal's Ctrl-C) and lets it continue: every released block must be in the
tracking store, every block in the store must have finished; a rerun over the same store runs
exactly the blocks not recorded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from daisy_nb.tracking import read_tracking

HERE = Path(__file__).resolve().parent
WORKERS = HERE / "workers"
sys.path.insert(0, str(WORKERS))

import drainprog  # noqa: E402
import harness  # noqa: E402


def _ids(out: Path, prefix: str) -> set[int]:
    return {int(p.name.split("_")[1]) for p in out.glob(f"{prefix}_*")}


def _wait_for(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


def _runners(state: Path) -> set[int]:
    return {int(p.read_text()) for p in state.glob("*.runner")}


@pytest.fixture
def batch(tmp_path, monkeypatch):
    bin_dir, state, out = tmp_path / "bin", tmp_path / "state", tmp_path / "out"
    for d in (bin_dir, state, out):
        d.mkdir()
    for role in ("sbatch", "scancel"):
        p = bin_dir / role
        p.write_text(f'#!/bin/sh\nexec {sys.executable} {WORKERS / "fakebatch.py"} {role} "$@"\n')
        p.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKEBATCH_DIR", str(state))
    monkeypatch.delenv("FAKEBATCH_QUEUE_SECS", raising=False)
    yield state, out
    for pid in _runners(state):  # whatever a failed test left behind
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _driver(out: Path, trk: Path, run: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(WORKERS / "drainprog.py"), "driver", str(out), str(trk), run],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a shell's foreground job
    )


def _settled(out: Path, prefix: str, quiet_secs: float, timeout: float) -> set[int]:
    """The ``prefix`` marks once none has been added for ``quiet_secs`` (polled, with a deadline)."""
    deadline = time.monotonic() + timeout
    last, since = _ids(out, prefix), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = _ids(out, prefix)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_secs:
            return now
    raise AssertionError(f"{prefix} marks still growing after {timeout:g} s")


@pytest.mark.mp
@pytest.mark.timeout(240)
@pytest.mark.usefixtures("no_leaks")
def test_ctrl_c_records_the_releases_that_arrived_and_a_rerun_skips_them(batch, tmp_path):
    state, out = batch
    trk = tmp_path / "trk"
    d = _driver(out, trk, "1")
    try:
        _wait_for(lambda: len(_ids(out, "sent1")) >= 40, 120, "40 blocks released")
        os.killpg(d.pid, signal.SIGSTOP)  # the driver (and its worker functions) stop reading
        before = _ids(out, "sent1")
        sent = _settled(out, "sent1", quiet_secs=1.0, timeout=30)  # the jobs wait for answers now
        os.killpg(d.pid, signal.SIGINT)  # Ctrl-C, delivered when the group continues
        os.killpg(d.pid, signal.SIGCONT)
        text, _ = d.communicate(timeout=60)
    finally:
        if d.poll() is None:
            os.killpg(d.pid, signal.SIGKILL)
            d.wait()
    assert d.returncode == 42 and "KI" in text, text
    _wait_for(lambda: not any(harness.pid_alive(p) for p in _runners(state)), 30, "the jobs to end")
    assert sent - before, "no release was waiting in the driver's buffers: the scenario did not happen"
    tracked = set(np.flatnonzero(np.asarray(read_tracking(trk)["done"])).tolist())
    finished = _ids(out, "fin1")
    assert sent <= tracked, f"released but not recorded: {sorted(sent - tracked)}"
    assert tracked <= finished, f"recorded but never finished: {sorted(tracked - finished)}"

    d2 = _driver(out, trk, "2")  # the rerun, over the same tracking store
    try:
        text2, _ = d2.communicate(timeout=120)
    finally:
        if d2.poll() is None:
            os.killpg(d2.pid, signal.SIGKILL)
            d2.wait()
    assert d2.returncode == 0 and "DONE" in text2, text2
    _wait_for(lambda: not any(harness.pid_alive(p) for p in _runners(state)), 30, "the jobs to end")
    ran2 = _ids(out, "fin2")
    assert not ran2 & tracked, f"ran again: {sorted(ran2 & tracked)}"
    assert ran2 | tracked == set(range(drainprog.N_BLOCKS))
