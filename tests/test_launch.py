"""No job outlives its run: ``daisy_nb.launch`` (SLURM, LSF, local) and ``Client`` programs.

A driver subprocess (``tests/workers/launch_driver.py``) runs one task on 2 worker
functions whose jobs run ``launch_job.py`` (a ``Client`` loop, blocks of 30-60 s).
The batch commands are fakes on ``PATH`` (``tests/workers/fakebatch.py``): each job
runs under a runner in its own session after a queue delay, and ``sbatch --wait``
does not cancel its job when it is interrupted (as the real one). Every check is
by pid, with a deadline. Loopback only (``host="127.0.0.1"``).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
WORKERS = HERE / "workers"
sys.path.insert(0, str(WORKERS))

import harness  # noqa: E402

from daisy_nb import launch  # noqa: E402
from daisy_nb.progress import ABANDON_NOT_WAITING, ABANDON_RESTARTS  # noqa: E402

END_SECS = 10.0  # "no job outlives its run by more than ~5 s", with slack for a loaded 2-core CI machine (the jobs run 60 s blocks; bench_ctrl_c measures the real latency: < 1 s)
LONG_BLOCK = "60"
# how a launcher reports a job the run ended: cancelled, or its program (which ends with the run
# too) had exited just before scancel/bkill came, which then answered "already finished"
ENDED_BY_RUN = ("cancelled", "ended before the cancel")


@pytest.fixture
def batch(tmp_path, monkeypatch):
    """Fake ``sbatch``/``scancel``/``sacct``/``scontrol``/``bsub``/``bkill``/``bjobs`` on PATH; yields
    (state dir, out dir)."""
    bin_dir, state, out = tmp_path / "bin", tmp_path / "state", tmp_path / "out"
    for d in (bin_dir, state, out):
        d.mkdir()
    for role in ("sbatch", "scancel", "sacct", "scontrol", "bsub", "bkill", "bjobs"):
        p = bin_dir / role
        p.write_text(f'#!/bin/sh\nexec {sys.executable} {WORKERS / "fakebatch.py"} {role} "$@"\n')
        p.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKEBATCH_DIR", str(state))
    for var in ("FAKEBATCH_QUEUE_SECS", "FAKEBATCH_WALLTIME_SECS", "FAKEBATCH_SACCT", "FAKEBATCH_QUERY_HANG"):
        monkeypatch.delenv(var, raising=False)
    yield state, out
    for pid in _all_pids(state, out):  # whatever a failed test left behind
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _pids(out: Path, prefix: str) -> set[int]:
    return {int(p.name.split("_")[1]) for p in out.glob(f"{prefix}_*")}


def _runner_pids(state: Path) -> set[int]:
    out = set()
    for p in state.glob("*.runner"):
        out.add(int(p.read_text()))
    return out


def _all_pids(state: Path, out: Path) -> set[int]:
    return _pids(out, "pid") | _runner_pids(state)


def _wait_for(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


def _driver(out: Path, how: str, blocks=4, workers=2, block_secs=LONG_BLOCK, mode="normal", env=None):
    return subprocess.Popen(
        [sys.executable, str(WORKERS / "launch_driver.py"), str(out), how, str(blocks), str(workers), block_secs, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
    )


def _gone_within(pids: set[int], secs: float) -> float:
    """Seconds until every pid in ``pids`` is gone (zombies count as gone); fails after ``secs``."""
    t0 = time.monotonic()
    _wait_for(lambda: not any(harness.pid_alive(p) for p in pids), secs, f"pids {sorted(pids)} to end")
    return time.monotonic() - t0


def _descendants(d) -> set[int]:
    import psutil

    try:
        return {p.pid for p in psutil.Process(d.pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def _kill_driver(d, kids=None) -> None:
    """SIGKILL the driver (if alive); its worker processes ``kids`` follow (their death signals),
    on a busy machine too."""
    kids = _descendants(d) if kids is None else kids
    d.kill()
    _finish(d)
    _gone_within(kids, 20)


def _jobs(out: Path) -> list[dict]:
    path = out / "progress.jsonl"
    if not path.exists():
        return []
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [x for x in lines if x.get("event") == "job"]


def _in_blocks(out: Path, n: int):
    return _wait_for(lambda: len(_pids(out, "inblock")) >= n, 60, f"{n} jobs running a block")


def _finish(proc, timeout=30) -> tuple[int, str]:
    text, _ = proc.communicate(timeout=timeout)
    return proc.returncode, text


def _states(text: str) -> dict:
    """The task states the driver printed at its end (``DRIVER_STATES``), by task id."""
    lines = [x for x in text.splitlines() if x.startswith("DRIVER_STATES ")]
    assert len(lines) == 1, text
    return json.loads(lines[0].split(" ", 1)[1])


def _ids(state: Path) -> set[str]:
    """The ids of every job submitted to the fake batch system."""
    return {p.name.split(".")[0] for p in state.glob("*.runner")}


# ------------------------------------------------------------------------- launchers
@pytest.mark.parametrize("how", ["slurm", "lsf", "local"])
def test_ctrl_c_cancels_every_job(batch, how, no_leaks):
    """Ctrl-C of the driver while both jobs run a 60 s block: jobs cancelled (scancel/bkill/killpg),
    ids recorded in the JSON observer and the worker logs, every job process gone within ~5 s."""
    state, out = batch
    d = _driver(out, how)
    _in_blocks(out, 2)
    jobs = _pids(out, "pid") | _runner_pids(state)
    t0 = time.monotonic()
    d.send_signal(signal.SIGINT)
    rc, text = _finish(d)
    assert rc != 0 and "DRIVER_DONE" not in text, text
    _gone_within(jobs, END_SECS - (time.monotonic() - t0))
    reports = _jobs(out)
    submitted = {r["job"] for r in reports if r["state"] in ("submitted", "running")}
    assert len(submitted) == 2, reports
    # cancelled, or (the job's program ends with its run too) ended just before scancel/bkill came
    assert {r["job"] for r in reports if r["state"] in ENDED_BY_RUN} == submitted, reports
    assert all(r["scheduler"] == how and r["task"] == "launch" for r in reports)
    logs = "".join(p.read_text() for p in (out / "logs" / "launch").glob("worker_*.err"))
    for jid in submitted:
        assert any(f"daisy_nb.launch: {how} job {jid} {e}" in logs for e in ENDED_BY_RUN), logs
        if how != "local":  # the batch system was told, not only the submit command
            assert (state / f"{jid}.cancel_asked").exists()
    assert not _pids(out, "end")  # no job loop ended normally


def test_sigkill_of_the_driver_cancels_the_jobs(batch, no_leaks):
    """The driver SIGKILLed: the worker functions' death signal (SIGTERM) lets the launcher bkill."""
    state, out = batch
    d = _driver(out, "lsf")
    _in_blocks(out, 2)
    jobs = _pids(out, "pid") | _runner_pids(state)
    kids = _descendants(d)
    t0 = time.monotonic()
    d.kill()
    _gone_within(jobs, END_SECS - (time.monotonic() - t0))
    _kill_driver(d, kids)
    ids = {p.name.split(".")[0] for p in state.glob("*.runner")}
    assert len(ids) == 2
    _wait_for(
        lambda: all((state / f"{i}.cancel_asked").exists() for i in ids), 60, "bkill of both jobs"
    )  # a fake bkill is a Python start-up: seconds under load


def test_a_worker_ended_for_a_timeout_cancels_its_job(batch, no_leaks):
    """A block past the task's timeout ends its worker function (to be replaced): its job is cancelled."""
    state, out = batch
    d = _driver(out, "slurm", blocks=1, workers=1, env={"LAUNCH_TIMEOUT": "2"})
    rc, text = _finish(d, timeout=120)
    assert "DRIVER_DONE 0" in text, text  # the one block failed (max_retries=0)
    ids = {p.name.split(".")[0] for p in state.glob("*.runner")}
    assert len(ids) == 1 and (state / f"{next(iter(ids))}.cancelled").exists()  # its block still ran: no race
    assert {r["state"] for r in _jobs(out)} >= {"submitted", "cancelled"}
    _gone_within(_all_pids(state, out), END_SECS)


def test_pending_job_is_cancelled_and_never_starts(batch, monkeypatch, no_leaks):
    """A job still waiting in the queue when the run is interrupted is cancelled: it never starts."""
    state, out = batch
    monkeypatch.setenv("FAKEBATCH_QUEUE_SECS", "30")
    d = _driver(out, "slurm", workers=1)
    reported = _wait_for(lambda: [r for r in _jobs(out) if r["state"] == "submitted"], 60, "the job's id")
    jid = reported[0]["job"]
    runner = int((state / f"{jid}.runner").read_text())
    d.send_signal(signal.SIGINT)
    _finish(d)
    _gone_within({runner}, END_SECS)  # the runner that would start the job after its queue delay
    assert (state / f"{jid}.cancelled").exists()
    assert not (state / f"{jid}.started").exists() and not _pids(out, "pid")


@pytest.mark.parametrize("how", ["slurm", "lsf"])
def test_abandoned_launcher_task_cancels_the_jobs_it_submitted(batch, how, no_leaks):
    """The launcher task runs downstream of a task whose workers crash (``LAUNCH_UPSTREAM=crash``):
    that one hits its restart cap while the launcher's jobs hold 60 s blocks (or wait for one), and
    the launcher task is abandoned with it. Every job it submitted is cancelled (scancel/bkill), or
    had ended with the run just before, and no job process outlives the run."""
    state, out = batch
    d = _driver(out, how, env={"LAUNCH_UPSTREAM": "crash"})
    _in_blocks(out, 1)  # the upstream workers crash only once a job runs a block
    rc, text = _finish(d, timeout=120)
    t_end = time.monotonic()
    jobs = _all_pids(state, out)
    _gone_within(jobs, END_SECS - (time.monotonic() - t_end))
    assert rc != 0 and "DRIVER_DONE" not in text, text
    assert "DRIVER_RAISED RuntimeError: task 'up' was abandoned (worker restart cap exhausted)" in text, text
    states = _states(text)
    assert states["up"]["abandoned"] and states["up"]["abandon_reason"] == ABANDON_RESTARTS, text
    assert states["launch"]["abandoned"] and states["launch"]["abandon_reason"] == "upstream task abandoned", text
    assert states["launch"]["completed"] == 0 and states["launch"]["orphaned"] == 4, text
    ids = _ids(state)
    reports = _jobs(out)
    assert ids and {r["job"] for r in reports if r["state"] == "submitted"} == ids, reports
    assert {r["job"] for r in reports if r["state"] in ENDED_BY_RUN} == ids, reports
    assert all(r["task"] == "launch" and r["scheduler"] == how for r in reports), reports
    for jid in ids:  # the batch system was told, also of a job that never got a block
        assert (state / f"{jid}.cancel_asked").exists(), jid
        assert (state / f"{jid}.cancelled").exists() or (state / f"{jid}.rc").exists(), jid
    # no block ran to its end (a job that waited for a block may have been told "no more work")
    assert not _pids(out, "blockdone")


def test_launcher_jobs_that_keep_failing_abandon_the_task_and_leave_no_job(batch, no_leaks):
    """Jobs that exit with status 3 before they connect: each worker function raises
    ``CalledProcessError`` (a crash: no block finished), the restart cap abandons the task. Every job
    was recorded and reported with its exit status; none was left running (nothing to cancel)."""
    state, out = batch
    d = _driver(out, "slurm", mode="exit3")
    rc, text = _finish(d, timeout=120)
    t_end = time.monotonic()
    _gone_within(_all_pids(state, out), END_SECS - (time.monotonic() - t_end))
    assert rc != 0 and "DRIVER_DONE" not in text, text
    assert "DRIVER_RAISED RuntimeError: task 'launch' was abandoned (worker restart cap exhausted)" in text, text
    st = _states(text)["launch"]
    assert st["abandoned"] and st["abandon_reason"] == ABANDON_RESTARTS, text
    assert st["completed"] == 0 and st["orphaned"] == 4 and st["worker_restarts"] == 1, text
    # its error says what happened: the job failed by itself (sacct), it never had a block, no job connected
    err = st["first_worker_error"].splitlines()[0]
    assert re.match(
        r"daisy worker process exited with code 1: its slurm job \d+ ended FAILED \(exit code 3\) "
        r"\(no worker of this task has connected",
        err,
    ), err
    ids = _ids(state)
    assert len(ids) == st["worker_failures"] == 3, (ids, text)  # 2 workers, 1 restart: one job each
    assert all((state / f"{jid}.rc").read_text() == "3" for jid in ids)
    assert not list(state.glob("*.cancel_asked"))  # every job had ended: the launcher cancels nothing
    reports = _jobs(out)
    assert {r["job"] for r in reports if r["state"] == "submitted"} == ids, reports
    assert {r["job"] for r in reports if r["state"] == "failed (exit status 3)"} == ids, reports
    logs = "".join(p.read_text() for p in (out / "logs" / "launch").glob("worker_*.err"))
    assert all(f"daisy_nb.launch: slurm job {jid} failed (exit status 3)" in logs for jid in ids), logs


@pytest.mark.parametrize(("how", "raising"), [("slurm", "observer"), ("lsf", "signal"), ("plain", "signal")])
def test_a_run_ended_by_an_exception_ends_every_job(batch, how, raising, no_leaks):
    """The run ends by an exception while both jobs run 60 s blocks: a ``SIGTERM`` handler of the
    driver raises ``Preempted`` (a driver that is itself a batch job, at its walltime), or the
    progress observer raises ``SystemExit`` from ``on_progress`` (``notify`` swallows only
    ``Exception``). The exception reaches the caller; the launchers cancel their jobs (a
    hand-written worker function's job: its ``Client`` interrupts the block); every job process is
    gone within the deadline."""
    state, out = batch
    d = _driver(out, how, env={"LAUNCH_RAISE": raising})
    _in_blocks(out, 2)  # the observer raises at its next on_progress (every 0.2 s) from here
    jobs = _all_pids(state, out)
    t0 = time.monotonic()
    if raising == "signal":
        d.send_signal(signal.SIGTERM)
    rc, text = _finish(d)
    _gone_within(jobs, END_SECS - (time.monotonic() - t0))
    if raising == "signal":
        assert rc == 1 and "DRIVER_RAISED Preempted: the driver got signal 15" in text, text
    else:
        assert rc == 7 and "DRIVER_RAISED SystemExit: 7" in text, text
    assert "DRIVER_DONE" not in text and "DRIVER_STATES" not in text, text
    assert not _pids(out, "blockdone") and not _pids(out, "end")
    if how == "plain":
        assert _pids(out, "interrupted") == _pids(out, "pid")  # the block body got KeyboardInterrupt
        return
    ids = _ids(state)
    reports = _jobs(out)
    assert len(ids) == 2 and {r["job"] for r in reports if r["state"] == "submitted"} == ids, reports
    assert {r["job"] for r in reports if r["state"] in ENDED_BY_RUN} == ids, reports
    assert all((state / f"{jid}.cancel_asked").exists() for jid in ids)


def test_normal_run_completes_and_every_job_exits_0(batch, no_leaks):
    state, out = batch
    d = _driver(out, "slurm", blocks=6, block_secs="0.1")
    rc, text = _finish(d, timeout=120)
    assert rc == 0 and "DRIVER_DONE 6" in text, text
    ids = {p.name.split(".")[0] for p in state.glob("*.runner")}
    assert len(ids) == 2
    assert all((state / f"{i}.rc").read_text() == "0" for i in ids)
    assert not list(state.glob("*.cancelled"))
    assert sum(int(p.read_text()) for p in out.glob("end_*")) == 6  # loops ended by "no more work"
    assert not _pids(out, "interrupted")
    done = {r["job"] for r in _jobs(out) if r["state"] == "done"}
    assert done == ids


@pytest.mark.parametrize("how", ["slurm", "lsf"])
def test_normal_end_with_a_slow_submit_command_is_not_a_failed_cancel(batch, how, no_leaks):
    """At a normal end the jobs' programs have exited but ``sbatch --wait``/``bsub -K`` (which poll)
    have not noticed yet: the run ends them, scancel/bkill answer "already finished", and that is
    reported as such, not as a warning that the cancel failed."""
    state, out = batch
    d = _driver(out, how, blocks=6, block_secs="0.1", env={"FAKEBATCH_WAIT_LAG_SECS": "30"})
    rc, text = _finish(d, timeout=120)
    assert rc == 0 and "DRIVER_DONE 6" in text, text
    ids = {p.name.split(".")[0] for p in state.glob("*.runner")}
    assert len(ids) == 2 and all((state / f"{i}.rc").read_text() == "0" for i in ids)
    ends = {r["job"]: r["state"] for r in _jobs(out) if r["state"] not in ("submitted", "running")}
    assert set(ends) == ids and set(ends.values()) <= {"done", "ended before the cancel"}, ends
    assert "cancel failed" not in text, text


def test_failed_job_raises_like_check_true(batch, tmp_path):
    """The job's exit status: the worker function raises CalledProcessError (subprocess.run(check=True))."""
    fn = launch.slurm([sys.executable, "-c", "raise SystemExit(3)"])
    fn = pickle.loads(pickle.dumps(fn))  # a Task's process_function travels pickled
    with pytest.raises(subprocess.CalledProcessError) as e:
        fn()
    assert e.value.returncode == 3 and fn.job_id is not None
    assert launch.lsf([sys.executable, "-c", "pass"])().returncode == 0
    with pytest.raises(subprocess.CalledProcessError):
        launch.local([sys.executable, "-c", "raise SystemExit(2)"])()


def test_launch_imports_no_numpy_or_numba():
    """Worker programs and worker-function processes import the launchers: standard library only."""
    code = "import sys, daisy_nb.launch; print(sorted(m for m in ('numpy', 'numba') if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"


def test_launcher_arguments_are_checked():
    with pytest.raises(TypeError, match="command"):
        launch.slurm(42)
    with pytest.raises(ValueError, match="command"):
        launch.lsf([])
    with pytest.raises(TypeError, match="args"):
        launch.slurm(["x"], args="--mem=1G")
    with pytest.raises(TypeError, match="env"):
        launch.local(["x"], env={"A": 1})
    f = launch.slurm("python w.py", partition="gpu", gpus=2, time_limit="1:00:00", args=["--mem=1G"])
    assert f.submit[:3] == ["sbatch", "--parsable", "--wait"]
    assert {"--partition=gpu", "--gpus=2", "--time=1:00:00", "--mem=1G"} <= set(f.submit)
    assert f.submit[-2:] == ["--wrap", "python w.py"]
    g = launch.lsf(["python", "w.py"], queue="q", gpus=1)
    assert g.submit == ["bsub", "-K", "-q", "q", "-gpu", "num=1", "python", "w.py"]


# ------------------------------------------------------------------- Client programs
@pytest.mark.parametrize("end", ["ctrl_c", "sigkill"])
def test_client_program_in_a_long_block_ends_with_the_run(batch, end, no_leaks):
    """The hand-written form (the job detached in its own session, nothing cancels it): its
    ``Client`` sees the run end and interrupts the block (KeyboardInterrupt), within ~5 s."""
    state, out = batch
    d = _driver(out, "plain")
    _in_blocks(out, 2)
    jobs = _pids(out, "pid")
    kids = _descendants(d)
    t0 = time.monotonic()
    d.send_signal(signal.SIGINT) if end == "ctrl_c" else d.kill()
    _gone_within(jobs, END_SECS - (time.monotonic() - t0))
    _kill_driver(d, kids)
    assert _pids(out, "interrupted") == jobs  # the block body got KeyboardInterrupt
    assert not _pids(out, "blockdone")


def test_client_program_ends_when_its_scheduler_goes_silent(batch, no_leaks):
    """A vanished driver machine (here: SIGSTOP, its sockets stay open): the scheduler heartbeats busy
    clients too, so a job in a long block notices the silence after the peer timeout and ends."""
    state, out = batch
    d = _driver(out, "plain", env={"DAISY_NB_PEER_TIMEOUT_SECS": "2", "DAISY_NB_HEARTBEAT_SECS": "0.5"})
    kids = None
    try:
        _in_blocks(out, 2)
        jobs = _pids(out, "pid")
        kids = _descendants(d)
        t0 = time.monotonic()
        d.send_signal(signal.SIGSTOP)
        _gone_within(jobs, 2 + END_SECS - (time.monotonic() - t0))
        assert _pids(out, "interrupted") == jobs
    finally:
        _kill_driver(d, kids)


def test_blocks_longer_than_the_peer_timeout_run_to_their_end(batch, no_leaks):
    """A live scheduler heartbeats clients that run a block: silence means a vanished run, never a long block."""
    state, out = batch
    env = {"DAISY_NB_PEER_TIMEOUT_SECS": "1", "DAISY_NB_HEARTBEAT_SECS": "0.25"}
    d = _driver(out, "plain", blocks=2, workers=1, block_secs="2.5", env=env)
    rc, text = _finish(d, timeout=120)
    assert rc == 0 and "DRIVER_DONE 2" in text, text
    assert not _pids(out, "interrupted")


def test_client_program_that_swallows_the_interrupt_still_ends(batch, no_leaks):
    state, out = batch
    d = _driver(out, "plain", mode="stubborn", env={"DAISY_NB_EXIT_GRACE_SECS": "2"})
    _in_blocks(out, 2)
    jobs = _pids(out, "pid")
    t0 = time.monotonic()
    d.send_signal(signal.SIGINT)
    _finish(d)
    _gone_within(jobs, END_SECS - (time.monotonic() - t0))
    assert _pids(out, "interrupted") == jobs


def test_abandonment_ends_the_jobs_of_a_fire_and_forget_submit(batch, no_leaks):
    """``sbatch`` without ``--wait``: the worker functions return at once, the task is abandoned
    while the jobs run long blocks; their clients end them.
    (The worker functions fail once a job runs a block: the restart cap is exhausted; or a job
    connects after its worker function returned: daisy 2.0.0's "did not wait" stop.)"""
    state, out = batch
    d = _driver(out, "fireforget")
    _wait_for(lambda: len(_pids(out, "inblock")) >= 1, 60, "a job running a block")
    rc, text = _finish(d, timeout=120)
    t_end = time.monotonic()
    jobs = _pids(out, "pid") | _runner_pids(state)
    _gone_within(jobs, END_SECS - (time.monotonic() - t_end))
    # abandoned, not ended for another reason: run_blockwise raised with the states attached
    assert rc != 0 and "DRIVER_DONE" not in text, text
    st = _states(text)["launch"]
    assert st["abandoned"] and st["abandon_reason"] in (ABANDON_RESTARTS, ABANDON_NOT_WAITING), text
    assert f"DRIVER_RAISED RuntimeError: task 'launch' was abandoned ({st['abandon_reason']})" in text, text
    assert st["completed"] == 0 and st["orphaned"] == 4, text
    assert not _pids(out, "blockdone")
    assert _pids(out, "inblock") <= _pids(out, "interrupted")  # ended by their clients, not at the block's end


def test_opt_out_lets_the_block_finish(batch, no_leaks):
    """``Client(exit_with_run=False)``: the block is not interrupted; the loop ends at the next acquire."""
    state, out = batch
    d = _driver(out, "plain", workers=1, block_secs="3", mode="optout")
    _in_blocks(out, 1)
    (job,) = _pids(out, "pid")
    d.send_signal(signal.SIGINT)
    _finish(d)
    _wait_for(lambda: _pids(out, "end"), 30, "the job's loop to end")
    assert (out / f"blockdone_{job}_1").exists() and not _pids(out, "interrupted")
    assert (out / f"end_{job}").read_text() == "1"
    _gone_within({job}, 10)


def test_client_exit_settings_are_checked(monkeypatch):
    from daisy_nb.runtime.client import _exit_settings

    assert _exit_settings(None)[0] is True
    monkeypatch.setenv("DAISY_NB_EXIT_WITH_RUN", "0")
    assert _exit_settings(None)[0] is False
    assert _exit_settings(True)[0] is True
    monkeypatch.setenv("DAISY_NB_EXIT_WITH_RUN", "maybe")
    with pytest.raises(ValueError, match="DAISY_NB_EXIT_WITH_RUN"):
        _exit_settings(None)
    with pytest.raises(TypeError, match="exit_with_run"):
        _exit_settings("yes")
    monkeypatch.delenv("DAISY_NB_EXIT_WITH_RUN")
    monkeypatch.setenv("DAISY_NB_EXIT_GRACE_SECS", "-1")
    with pytest.raises(ValueError, match="DAISY_NB_EXIT_GRACE_SECS"):
        _exit_settings(None)


def test_dashboard_worker_list_shows_the_job(batch, no_leaks):
    """The dashboard's worker rows carry the launcher's job (scheduler, id, state)."""
    import threading
    import urllib.request

    import daisy_nb
    from daisy_nb.dashboard import Dashboard

    state, out = batch
    fn = launch.slurm([sys.executable, str(WORKERS / "launch_job.py"), str(out), "0.3", "normal"])
    task = daisy_nb.Task(
        "dash",
        daisy_nb.Roi((0,), (8,)),
        daisy_nb.Roi((0,), (1,)),
        daisy_nb.Roi((0,), (1,)),
        process_function=fn,
        read_write_conflict=False,
        max_workers=1,
        max_retries=0,
        tracking_path=False,
    )
    seen: list = []
    with Dashboard(quiet=True) as dash:

        def watch():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not seen:
                with urllib.request.urlopen(dash.url_for("api/state"), timeout=10) as r:
                    s = json.loads(r.read())
                seen.extend(w["job"] for w in s["workers"] if w.get("job"))
                time.sleep(0.1)

        th = threading.Thread(target=watch)
        th.start()
        states = daisy_nb.run_blockwise(
            task, dashboard=dash, progress=False, summary=False, return_states=True, host="127.0.0.1"
        )
        th.join()
    assert states["dash"].completed_count == 8
    (jid,) = {p.name.split(".")[0] for p in state.glob("*.runner")}
    assert seen and seen[0].startswith(f"slurm {jid} "), seen


# ------------------------------------------------------------------- why a job died
PY = sys.executable
OOM_JOB = 'echo 16582348K > "$FAKEBATCH_DIR/$SLURM_JOB_ID.maxrss"; exit 137'  # as the OOM killer leaves it
OOM = "OUT_OF_MEMORY (used 15.8 GiB of 16 GiB requested)"


def _failed(fn) -> launch.JobFailed:
    """Run the worker function ``fn`` (its job fails): the exception, a ``CalledProcessError`` too."""
    with pytest.raises(subprocess.CalledProcessError) as e:
        fn()
    assert isinstance(e.value, launch.JobFailed)
    return e.value


def _cause(fn) -> str | None:
    err = _failed(fn)
    return None if err.cause is None else str(err.cause)


@pytest.mark.parametrize(
    ("how", "fn", "cause"),
    [
        ("slurm", lambda: launch.slurm([PY, "-c", "raise SystemExit(3)"]), "FAILED (exit code 3)"),
        ("slurm", lambda: launch.slurm(["sh", "-c", OOM_JOB], args=["--mem=16G"]), OOM),
        ("slurm", lambda: launch.slurm(["sleep", "60"], time_limit="0:01"), "TIMEOUT (walltime)"),
        ("lsf", lambda: launch.lsf([PY, "-c", "raise SystemExit(3)"]), "FAILED (exit code 3)"),
        ("lsf", lambda: launch.lsf(["sh", "-c", OOM_JOB], args=["-M", "16G"]), OOM),
    ],
)
def test_a_failed_job_says_why(batch, how, fn, cause, no_leaks):
    """The launcher asks the batch system (sacct; bjobs -l) why its job failed: the exception's
    message, its ``.cause``, the worker's ``.err`` line all say it."""
    fn = pickle.loads(pickle.dumps(fn()))
    err = _failed(fn)
    name = {"slurm": "SLURM", "lsf": "LSF"}[how]
    assert str(err.cause) == cause and err.cause.kind == cause.split()[0]
    assert str(err).startswith(f"{name} job {fn.job_id} ended: {cause}; "), str(err)
    assert err.returncode != 0 and err.job_id == fn.job_id and err.scheduler == how
    again = pickle.loads(pickle.dumps(err))  # an exception that travels keeps its cause
    assert str(again) == str(err) and again.cause == err.cause


def test_a_job_killed_at_its_lsf_walltime_is_a_timeout(batch, monkeypatch, no_leaks):
    monkeypatch.setenv("FAKEBATCH_WALLTIME_SECS", "1")  # bsub -W counts minutes
    assert _cause(launch.lsf(["sleep", "60"])) == "TIMEOUT (walltime)"


@pytest.mark.parametrize(
    ("how", "end", "cause"),
    [
        ("slurm", "scancel", "CANCELLED"),
        ("lsf", "bkill", "CANCELLED"),
        ("slurm", "PREEMPTED", "PREEMPTED"),
        ("lsf", "PREEMPTED", "PREEMPTED"),
        ("slurm", "NODE_FAIL", "NODE_FAIL"),
    ],
)
def test_a_job_ended_by_the_batch_system_says_so(batch, how, end, cause, no_leaks):
    """A running job cancelled by someone else (scancel/bkill), preempted, or on a node that failed."""
    import threading

    state, out = batch
    fn = getattr(launch, how)(["sleep", "60"])
    caught: list = []

    def call():
        try:
            fn()
        except BaseException as e:
            caught.append(e)

    th = threading.Thread(target=call)  # not the main thread: the launcher installs no signal handler
    th.start()
    try:
        _wait_for(lambda: fn.job_id and (state / f"{fn.job_id}.started").exists(), 60, "the job to start")
        argv = [end, fn.job_id] if end in ("scancel", "bkill") else ["end", fn.job_id, end]
        subprocess.run([PY, str(WORKERS / "fakebatch.py"), *argv], check=True, capture_output=True)
    finally:
        th.join(60)
    assert not th.is_alive() and len(caught) == 1, caught
    assert isinstance(caught[0], launch.JobFailed) and str(caught[0].cause) == cause, caught


@pytest.mark.parametrize("sacct", ["off", "empty", "missing"])
def test_scontrol_answers_when_sacct_cannot(batch, monkeypatch, sacct, no_leaks):
    """Accounting disabled, nothing recorded yet, or no sacct at all: ``scontrol show job`` (which
    knows the memory requested, not the memory used)."""
    state, out = batch
    if sacct == "missing":
        (state.parent / "bin" / "sacct").unlink()
    else:
        monkeypatch.setenv("FAKEBATCH_SACCT", sacct)
    fn = launch.slurm(["sh", "-c", OOM_JOB], args=["--mem=16G"])
    assert _cause(fn) == "OUT_OF_MEMORY (16 GiB requested)"
    assert _cause(launch.slurm([PY, "-c", "raise SystemExit(4)"])) == "FAILED (exit code 4)"


@pytest.mark.parametrize("how", ["slurm", "lsf"])
def test_a_query_that_fails_or_hangs_adds_nothing(batch, monkeypatch, how, no_leaks):
    """No answer (no such commands) or a hung controller (each query cut at ``CAUSE_TIMEOUT_SECS``):
    the plain ``CalledProcessError`` message, no cause, no hang."""
    state, out = batch
    monkeypatch.setattr(launch, "CAUSE_TIMEOUT_SECS", 0.5)
    monkeypatch.setenv("FAKEBATCH_QUERY_HANG", "1")
    fn = getattr(launch, how)([PY, "-c", "raise SystemExit(3)"])
    t0 = time.monotonic()
    err = _failed(fn)
    assert time.monotonic() - t0 < 30 and err.cause is None and err.returncode != 0
    assert str(err) == str(subprocess.CalledProcessError(err.returncode, err.cmd))
    for role in ("sacct", "scontrol", "bjobs"):
        (state.parent / "bin" / role).unlink()
    assert _failed(fn).cause is None


def test_cause_parsers_read_what_the_real_commands_write():
    """Output shapes of real SLURM versions (ReqMem per node ``n``/per CPU ``c``; an allocation
    that says FAILED over an out-of-memory step) and LSF's wrapped ``bjobs -l``."""
    sacct = launch.slurm_cause_from_sacct
    assert str(sacct("OUT_OF_MEMORY|0:125||16G\nOUT_OF_MEMORY|0:125|16582348K|\nCOMPLETED|0:0|0|\n")) == OOM
    assert str(sacct("FAILED|1:0||16Gn\nOUT_OF_MEMORY|0:125|16582348K|16Gn\n")) == OOM
    assert str(sacct("FAILED|0:9||4000Mc\nFAILED|0:9|1024|4000Mc\n")) == "FAILED (signal 9)"
    assert str(sacct("CANCELLED by 1000|0:0||1G\nCANCELLED|0:15|12K|\n")) == "CANCELLED"
    assert str(sacct("TIMEOUT|0:0||1G\nCANCELLED|0:15|12K|\n")) == "TIMEOUT (walltime)"
    assert str(sacct("PREEMPTED|0:0||1G\n")) == "PREEMPTED" and str(sacct("NODE_FAIL|0:0||\n")) == "NODE_FAIL"
    assert sacct("") is None and sacct("RUNNING|0:0||1G\n") is None and sacct("COMPLETED|0:0||1G\n") is None
    scontrol = "JobId=7 JobName=wrap\n   JobState=TIMEOUT Reason=TimeLimit Dependency=(null)\n   ExitCode=0:15\n"
    assert str(launch.slurm_cause_from_scontrol(scontrol)) == "TIMEOUT (walltime)"
    assert launch.slurm_cause_from_scontrol("slurm_load_jobs error: Invalid job id specified") is None
    bjobs = (
        "Job <7>, Job Name <w>, User <me>, Project <default>, Status <EXIT>, Queue <n\n"
        "                     ormal>, Command <python w.py>\n"
        " Exited with exit code 130. The CPU time used is 3.0 seconds.\n"
        " TERM_MEMLIMIT: job killed after reaching LSF memory usage limi\n"
        "                     t.\n"
        " MAX MEM: 15.8 Gbytes;  AVG MEM: 4 Gbytes\n"
        " MEMLIMIT\n"
        "      16 G \n"
    )
    assert str(launch.lsf_cause_from_bjobs(bjobs)) == OOM
    assert str(launch.lsf_cause_from_bjobs(" TERM_RUNLIMIT: job killed after reaching LSF run time limit.\n")) == (
        "TIMEOUT (walltime)"
    )
    assert launch.lsf_cause_from_bjobs("Job <7> is not found") is None


@pytest.mark.parametrize(("mode", "job_end"), [("hang1", True), ("oom1", False)])
def test_the_cause_decides_job_end_or_crash(batch, mode, job_end, no_leaks):
    """A job that finished a block and then died: preempted (the batch system's doing) is a job end,
    replaced without counting toward max_worker_restarts; out of memory (its own doing) a crash.
    Either way the cause is in the job's report (JSON ``job`` line, ``.err`` log) and the worker
    error."""
    state, out = batch
    d = _driver(out, "slurm", blocks=4, workers=1, block_secs="0.1", mode=mode)
    try:
        died = _wait_for(lambda: _pids(out, "died"), 60, "the first job to reach its second block")
        if mode == "hang1":
            (pid,) = died
            (jid,) = _ids(state)
            subprocess.run([PY, str(WORKERS / "fakebatch.py"), "end", jid, "PREEMPTED"], check=True)
        rc, text = _finish(d, timeout=120)
    finally:
        if d.poll() is None:
            _kill_driver(d)
    _gone_within(_all_pids(state, out), END_SECS)
    st = _states(text)["launch"]
    cause = "PREEMPTED" if job_end else "OUT_OF_MEMORY (used 999 MiB of 1 GiB requested)"
    assert st["worker_failures"] == 1 and st["worker_job_ends"] == (1 if job_end else 0), text
    assert rc == 0 and st["completed"] == 3 and st["failed"] == 1, text  # the block it held (max_retries=0)
    first = min(_ids(state), key=int)
    err = st["first_worker_error"].splitlines()[0]
    assert f": its slurm job {first} ended {cause}" in err, err
    assert ("a job end" in err) == job_end and ("a crash" in err) != job_end, err
    reports = [r for r in _jobs(out) if r["job"] == first and r["state"].startswith("failed")]
    assert len(reports) == 1 and reports[0]["cause"] == cause, _jobs(out)
    logs = "".join(p.read_text() for p in (out / "logs" / "launch").glob("worker_*.err"))
    assert f"daisy_nb.launch: slurm job {first} failed (exit status 137): {cause}" in logs, logs


def test_the_worker_list_shows_the_cause():
    """The dashboard's worker list and timeline show a job as ``job_text`` writes it."""
    from daisy_nb.runtime.local.exits import job_cause_kind
    from daisy_nb.runtime.local.records import job_text

    job = {"scheduler": "slurm", "job": "7", "state": "failed (exit status 1)", "cause": OOM}
    assert job_text(job) == f"slurm 7 failed (exit status 1): {OOM}" and job_cause_kind(job) == "OUT_OF_MEMORY"
    assert job_text({**job, "cause": ""}) == "slurm 7 failed (exit status 1)" and job_cause_kind({}) is None
