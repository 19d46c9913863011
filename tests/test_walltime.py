"""A job that knows when it ends is not handed a block it is unlikely to finish: real
``daisy_nb.Client`` programs over TCP.

The first job of the run (``tests/workers/walltimefns.py`` starts ``walltimeprog.py`` and
waits for it, as ``sbatch --wait`` would) ends ``WALLTIME_SECS`` after it started, known to
its ``Client`` from ``Client(end_time=...)`` or from ``SLURM_JOB_END_TIME``; its blocks take
``BLOCK_SECS``. Once its time left is under twice the task's median block time, it is told to
end (``daisy_nb/runtime/net/handout.py``): its program exits 0 before its end, its worker
function returns, nothing counts as a crash (``max_worker_restarts=0`` would abandon the task),
and another job is started for the blocks left. The same through ``daisy_nb.launch.slurm``
on the fake ``sbatch`` (``tests/workers/fakebatch.py``), which sets ``SLURM_JOB_END_TIME`` as
SLURM does and kills a job at its walltime: every job ends before that.
"""

import os
import signal
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "workers"))

import walltimefns  # noqa: E402
from funlib.geometry import Roi  # noqa: E402

import daisy_nb  # noqa: E402
from daisy_nb import launch  # noqa: E402

pytestmark = [pytest.mark.mp, pytest.mark.timeout(180), pytest.mark.usefixtures("no_leaks")]

N = 40  # blocks
BLOCK_SECS = 0.1
WALLTIME_SECS = 2.0  # from the first job's start: time for a few blocks, not all


def ended(out):
    """``{pid: (when, blocks it ran, its end time or None)}`` of the jobs whose Client loop ended."""
    res = {}
    for p in out.glob("ended_*"):
        t, n, end = p.read_text().split()
        res[int(p.name.split("_")[1])] = (float(t), int(n), None if end == "None" else float(end))
    return res


def _task(fn):
    return daisy_nb.Task(
        "t",
        Roi((0,), (10 * N,)),
        Roi((0,), (10,)),
        Roi((0,), (10,)),
        process_function=fn,
        read_write_conflict=False,
        max_workers=1,
        max_retries=0,
        max_worker_restarts=0,  # a job end counted as a crash would abandon the task
        tracking_path=False,
    )


@pytest.mark.parametrize("how", ["keyword", "slurm"])
def test_a_job_near_its_end_is_told_to_end_and_another_finishes_the_run(out, monkeypatch, how):
    monkeypatch.setenv("WALLTIME_HOW", how)
    monkeypatch.setenv("WALLTIME_SECS", str(WALLTIME_SECS))
    monkeypatch.setenv("BLOCK_SECS", str(BLOCK_SECS))
    monkeypatch.delenv("SLURM_JOB_END_TIME", raising=False)
    st = daisy_nb.Server().run_blockwise([_task(walltimefns.job)], progress=False, summary=False)["t"]
    assert st.completed_count == N and st.failed_count == 0 and st.orphaned_count == 0
    assert st.worker_failure_count == 0 and st.worker_restart_count == 0
    assert st.worker_start_count == 2, st.worker_start_count  # the timed job, then one for the rest
    jobs = ended(out)
    assert len(jobs) == 2, jobs
    ((timed_pid, (t_end, ran, end)),) = [(p, j) for p, j in jobs.items() if j[2] is not None]
    ((_, (_, rest, _)),) = [(p, j) for p, j in jobs.items() if j[2] is None]
    assert 1 <= ran < N and ran + rest == N, jobs
    assert t_end < end, "the timed job ran to its end instead of being told to end"
    for sid in range(N):
        pid, t = (out / f"done_{sid}").read_text().split()
        if int(pid) == timed_pid:
            assert float(t) < end  # every block it was given, it finished in time


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """Fake ``sbatch``/``scancel``/``sacct``/``scontrol`` on PATH (``tests/workers/fakebatch.py``);
    yields the state dir, and kills whatever job a failed test left behind."""
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    for d in (bin_dir, state):
        d.mkdir()
    for role in ("sbatch", "scancel", "sacct", "scontrol"):
        p = bin_dir / role
        p.write_text(f'#!/bin/sh\nexec {sys.executable} {HERE / "workers" / "fakebatch.py"} {role} "$@"\n')
        p.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKEBATCH_DIR", str(state))
    for var in ("FAKEBATCH_QUEUE_SECS", "FAKEBATCH_WALLTIME_SECS", "FAKEBATCH_SACCT", "FAKEBATCH_QUERY_HANG"):
        monkeypatch.delenv(var, raising=False)
    yield state
    for p in state.glob("*.runner"):
        try:
            os.killpg(int(p.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def test_launcher_jobs_end_before_their_slurm_walltime(out, fake_slurm, monkeypatch):
    """``launch.slurm(time_limit="0:03")`` jobs: each knows its end from ``SLURM_JOB_END_TIME``
    and ends before its walltime; none is killed (a ``TIMEOUT`` would be a job death)."""
    monkeypatch.setenv("BLOCK_SECS", str(BLOCK_SECS))
    monkeypatch.delenv("SLURM_JOB_END_TIME", raising=False)
    prog = [sys.executable, str(HERE / "workers" / "walltimeprog.py")]
    task = _task(launch.slurm(prog, time_limit="0:03"))  # the fake sbatch's "MM:SS": 3 s
    st = daisy_nb.Server().run_blockwise([task], progress=False, summary=False)["t"]
    assert st.completed_count == N and st.failed_count == 0
    assert st.worker_failure_count == 0 and st.worker_restart_count == 0
    jobs = ended(out)
    assert st.worker_start_count >= 2 and len(jobs) == st.worker_start_count, (st.worker_start_count, jobs)
    assert sum(n for _, n, _ in jobs.values()) == N
    for t_end, _, end in jobs.values():
        assert end is not None and t_end < end
    assert not list(fake_slurm.glob("*.state")), "a job was killed at its walltime"


# ---------------------------------------------------------------- the keyword
def _nowhere() -> daisy_nb.Context:
    """A context whose scheduler is not there: the Client warns and yields no block (no process)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return daisy_nb.Context(hostname="127.0.0.1", port=port, task_id="t", worker_id=0, authkey="00" * 32)


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ("2026-12-04T14:00", TypeError),
        (True, TypeError),
        ([1.0], TypeError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        (0, ValueError),
        (-5.0, ValueError),
        (3600, ValueError),  # a duration, not a time
        (10**400, ValueError),
    ],
)
def test_a_bad_end_time_is_a_clear_error(bad, error, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_END_TIME", raising=False)
    with pytest.raises(error, match="end_time must be a time in UNIX epoch seconds"):
        daisy_nb.Client(_nowhere(), end_time=bad)


def test_the_end_time_is_the_keyword_else_slurms_else_unknown(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_END_TIME", "1767225600")
    assert daisy_nb.Client(_nowhere()).end_time == 1767225600.0
    assert daisy_nb.Client(_nowhere(), end_time=1767225700.5).end_time == 1767225700.5  # the keyword wins
    monkeypatch.setenv("SLURM_JOB_END_TIME", "soon")
    with pytest.raises(ValueError, match="SLURM_JOB_END_TIME"):
        daisy_nb.Client(_nowhere())
    monkeypatch.delenv("SLURM_JOB_END_TIME")
    c = daisy_nb.Client(_nowhere())
    assert c.end_time is None and not c.connected
