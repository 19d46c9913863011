"""Crash loops, not job ends, abandon a task (``max_worker_restarts``).

A worker function's job that finished blocks and then ends (a walltime kill, a
preemption: here SIGKILL in the middle of a block, by the job itself, see
``workers/walltime.py``) is replaced without counting toward the cap:
``worker_failure_count`` and ``worker_job_end_count`` count it, and its replacement is a
restart as daisy 2.0.0 counts restarts (``worker_restart_count``). A job that dies
before finishing any block, or whose block raised, is a crash and counts toward the cap
as in daisy 2.0. A local block worker has no walltime: its death is a crash whatever it
finished before (daisy 2.0.0 counts it so).
Real worker processes; the 0-argument worker functions run a real worker program
(``workers/walltime_prog.py``) as their job.
"""

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "workers"))

import walltime  # noqa: E402
from funlib.geometry import Roi  # noqa: E402

import daisy_nb  # noqa: E402
from daisy_nb.progress import raise_if_abandoned  # noqa: E402

pytestmark = [pytest.mark.mp, pytest.mark.timeout(120), pytest.mark.usefixtures("no_leaks")]


def make_task(tid, n, fn, **kw):
    return daisy_nb.Task(
        tid,
        Roi((0,), (10 * n,)),
        Roi((0,), (10,)),
        Roi((0,), (10,)),
        process_function=fn,
        read_write_conflict=False,
        tracking_path=False,
        **kw,
    )


def run(task, progress=False):
    return daisy_nb.Server().run_blockwise([task], progress=progress, summary=False)[task.task_id]


def files(out, prefix):
    return sorted(out.glob(f"{prefix}_*"))


def attempts(out, tid, sid):
    p = out / f"attempt_{tid}_{sid}"
    return p.stat().st_size if p.exists() else 0


def done_ids(out, tid):
    return {int(p.name.rsplit("_", 1)[1]) for p in out.glob(f"done_{tid}_*")}


def test_twenty_job_ends_after_finished_blocks_do_not_abandon(out):
    """20+ jobs end (SIGKILL mid-block) after 3 finished blocks each, with max_worker_restarts=2:
    every one is replaced, nothing is abandoned, every block completes, the counters show the ends
    (and the replacements, as restarts: daisy 2.0.0 counts every one)."""
    log = out / "progress.jsonl"
    n = 90
    task = make_task("w", n, walltime.end_job, max_workers=2, max_worker_restarts=2)
    st = run(task, daisy_nb.JsonProgressObserver(path=str(log)))
    ends = files(out, "jobend")
    # each job takes 4 fresh blocks (3 finished, 1 it dies in); the retries (handed out last) end nobody
    assert len(ends) >= 20, len(ends)
    assert not files(out, "crash")
    assert not st.abandoned
    assert st.completed_count == n and st.failed_count == 0 and st.orphaned_count == 0
    assert done_ids(out, "w") == set(range(n))
    # every end is a failure and a job end, replaced (a restart as daisy 2.0.0 counts them: ends that
    # come together may share one), though 20 > max_worker_restarts: job ends do not count toward the cap
    assert st.worker_failure_count == st.worker_job_end_count == len(ends)
    assert 0 < st.worker_restart_count <= len(ends)
    last = [json.loads(x) for x in log.read_text().splitlines() if '"task": "w"' in x][-1]  # the JSON observer too
    assert last["job_ends"] == last["failures"] == len(ends) and last["restarts"] == st.worker_restart_count
    assert st.worker_start_count > len(ends)
    # each ended job's running block failed once and was retried
    assert sum(attempts(out, "w", i) for i in range(n)) == n + len(ends)
    assert "a job end" in st.last_worker_error


def test_block_worker_deaths_after_finished_blocks_are_crashes(out):
    """Local block workers that die (SIGKILL mid-block) after 3 finished blocks each: crashes, as daisy
    2.0.0 counts them: max_worker_restarts=2 restarts, then the task is abandoned."""
    st = run(make_task("b", 100, walltime.end_block, max_workers=1, max_worker_restarts=2, max_retries=5))
    assert len(files(out, "jobend")) == 3
    assert st.abandoned and st.abandon_reason == "worker restart cap exhausted"
    assert (st.worker_failure_count, st.worker_restart_count, st.worker_job_end_count) == (3, 2, 0)
    assert st.completed_count == 3 * walltime.FINISH
    assert "job end" not in st.last_worker_error and "walltime" not in st.last_worker_error


@pytest.mark.parametrize("fn", [walltime.crash_block, walltime.crash_job], ids=["block_function", "worker_function"])
def test_crash_loop_still_abandons_after_the_cap(out, fn):
    """Workers that die before finishing any block: max_worker_restarts restarts, then abandonment."""
    st = run(make_task("c", 20, fn, max_workers=1, max_worker_restarts=2, max_retries=5))
    assert st.abandoned and st.abandon_reason == "worker restart cap exhausted"
    assert (st.worker_failure_count, st.worker_restart_count, st.worker_job_end_count) == (3, 2, 0)
    assert len(files(out, "crash")) == 3 and st.completed_count == 0


@pytest.mark.parametrize("fn", [walltime.crash_block, walltime.crash_job], ids=["block_function", "worker_function"])
def test_workers_crashing_together_restart_no_more_than_the_cap(out, fn):
    """4 workers that all die at their first block, nearly together: a pass of the pool may want to
    replace several at once, but never past the cap (daisy 2.0.0: exactly max_worker_restarts
    restarts; daisy's own suite checks it 5 times in a row, as here)."""
    for _ in range(5):
        st = run(make_task("c", 20, fn, max_workers=4, max_worker_restarts=2, max_retries=0))
        assert st.abandoned and st.is_done()
        assert st.worker_restart_count == 2, (st.worker_failure_count, st.worker_start_count)


def test_job_ends_do_not_hide_a_crash_loop_that_follows(out):
    """5 job ends, then every job dies at its first block: the crashes alone exhaust the cap."""
    st = run(make_task("m", 60, walltime.ends_then_crash_job, max_workers=1, max_worker_restarts=2, max_retries=5))
    assert len(files(out, "jobend")) == walltime.ENDS and len(files(out, "crash")) == 3
    assert st.abandoned
    assert st.worker_failure_count == walltime.ENDS + 3
    assert st.worker_job_end_count == walltime.ENDS
    assert st.worker_restart_count == walltime.ENDS + 2  # every replacement (as daisy 2.0.0); the cap: 2 crashes
    assert st.completed_count == walltime.ENDS * walltime.FINISH  # retries come after the fresh blocks
    with pytest.raises(RuntimeError, match=r"failed 8 times \(5 of them job ends after finished blocks, not counted"):
        raise_if_abandoned({"m": st}, ["m"])  # what run_blockwise raises


@pytest.mark.parametrize("fn", [walltime.raise_block, walltime.raise_job], ids=["block_function", "worker_function"])
def test_a_block_that_raises_after_finished_blocks_is_a_crash(out, fn):
    """daisy 2.0: a raising block ends its worker, a dirty exit toward the cap, also after successes."""
    st = run(make_task("r", 40, fn, max_workers=1, max_worker_restarts=1, max_retries=5))
    assert st.abandoned
    assert (st.worker_failure_count, st.worker_restart_count, st.worker_job_end_count) == (2, 1, 0)
    assert st.completed_count == 2 * walltime.FINISH
    assert "raised after 3 finished blocks" in st.first_worker_error
