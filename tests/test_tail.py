"""No job idles at a task's tail: real ``daisy_nb.Client`` programs over TCP.

A task is at its tail when every block it has left is in flight. A job that asks for a
block then is told to end (its program and worker function return), except one kept
while a block in flight could still need a retry, for at most as long as a job takes to
start (``daisy_nb/runtime/net/tail.py``);
a block that fails at the tail is retried to success, on the kept job or on one job
started for it. The jobs are ``tests/workers/tailprog.py`` programs that their worker
functions (``tests/workers/tailfns.py``) run and wait for, as ``sbatch --wait`` would;
the stragglers wait, polling with a deadline, for another job to end while they run.
"""

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "workers"))

import tailfns  # noqa: E402
from funlib.geometry import Roi  # noqa: E402

import daisy_nb  # noqa: E402

pytestmark = [pytest.mark.mp, pytest.mark.timeout(180), pytest.mark.usefixtures("no_leaks")]

N = 14  # blocks
JOBS = 4  # worker functions (max_workers)


QUEUE_SECS = 3.0  # each job's time in the queue: a kept job waits that long at most (net/tail.py)


def run(fn, retries, monkeypatch, ends, queue=QUEUE_SECS):
    """Run the task; the stragglers' first attempts wait until ``ends`` other jobs have ended; each
    job starts after ``queue`` seconds."""
    monkeypatch.setenv("TAIL_ENDS", str(ends))
    monkeypatch.setenv("TAIL_QUEUE_SECS", str(queue))
    task = daisy_nb.Task(
        "t",
        Roi((0,), (10 * N,)),
        Roi((0,), (10,)),
        Roi((0,), (10,)),
        process_function=fn,
        read_write_conflict=False,
        max_workers=JOBS,
        max_retries=retries,
        max_worker_restarts=5,
        tracking_path=False,
    )
    return daisy_nb.Server().run_blockwise([task], progress=False, summary=False)["t"]


def ended(out):
    """``{pid: (when, blocks it ran)}`` of the jobs whose Client loop ended."""
    res = {}
    for p in out.glob("ended_*"):
        t, n = p.read_text().split()
        res[int(p.name.split("_")[1])] = (float(t), int(n))
    return res


def done(out, sid):
    """``(pid, when, attempt)`` of block ``sid``'s successful attempt."""
    pid, t, attempt = (out / f"done_{sid}").read_text().split()
    return int(pid), float(t), int(attempt)


@pytest.mark.parametrize("retries", [0, 2])
def test_jobs_end_while_the_last_straggler_runs(out, monkeypatch, retries):
    """Every job but the straggler's ends while the straggler runs; with retries left, one stays
    (parked) until the straggler's block is done, then ends too."""
    kept = 0 if retries == 0 else 1
    st = run(tailfns.one_straggler, retries, monkeypatch, ends=JOBS - 1 - kept)
    assert st.completed_count == N and st.failed_count == 0
    _, _, saw = (out / "straggler_0").read_text().split()
    assert saw == "True", "no job ended while the straggler ran"
    straggler_pid, t_done, _ = done(out, 0)
    ends = ended(out)
    assert straggler_pid in ends and len(ends) == JOBS  # every job started once, and ended
    assert st.worker_start_count == JOBS and st.worker_failure_count == 0
    before = [pid for pid, (t, _) in ends.items() if t < t_done]
    # while the straggler ran, every other job ended, but the one kept for a retry
    assert len(before) == JOBS - 1 - kept, (before, ends, t_done)


def test_the_kept_job_ends_once_it_waited_as_long_as_a_job_takes_to_start(out, monkeypatch):
    """Jobs that start at once (no queue): the one kept for a retry ends while the straggler still
    runs, once it has waited as long as a job took to start; nobody is started again."""
    st = run(tailfns.one_straggler, 2, monkeypatch, ends=JOBS - 1, queue=0.0)
    assert st.completed_count == N and st.failed_count == 0
    _, _, saw = (out / "straggler_0").read_text().split()
    assert saw == "True", "the kept job did not end while the straggler ran"
    assert st.worker_start_count == JOBS and st.worker_failure_count == 0
    assert len(ended(out)) == JOBS


def test_a_straggler_that_fails_at_the_tail_is_retried_on_the_kept_job(out, monkeypatch):
    """The straggler's job dies after the other jobs were released: its block's retry runs on the
    job kept for it, at once; no job is started for it."""
    monkeypatch.setenv("STRAGGLER_FAILS", "1")
    st = run(tailfns.one_straggler, 1, monkeypatch, ends=JOBS - 2)
    assert st.completed_count == N and st.failed_count == 0
    assert (out / "attempt_0").read_text() == "xx"
    pid, _, attempt = done(out, 0)
    assert attempt == 2
    assert st.worker_start_count == JOBS  # the kept job took the retry: nobody new
    assert st.worker_failure_count == 1  # the straggler's job
    ends = ended(out)
    # the retry ran on a job that ended normally; on a busy machine the kept job may have
    # started only after every block was handed out, so it may have run the retry alone
    assert pid in ends and ends[pid][1] >= 1


def test_two_stragglers_that_fail_at_the_tail_start_one_job_between_them(out, monkeypatch):
    """Two stragglers' jobs die at the tail: the kept job takes one retry, exactly one job is
    started for the other (worker functions start in proportion to the ready blocks), and both
    are retried to success."""
    monkeypatch.setenv("STRAGGLER_FAILS", "1")
    st = run(tailfns.two_stragglers, 1, monkeypatch, ends=JOBS - 3)
    assert st.completed_count == N and st.failed_count == 0
    for sid in (0, 1):
        assert (out / f"attempt_{sid}").read_text() == "xx"
        assert done(out, sid)[2] == 2
    assert st.worker_failure_count == 2
    assert st.worker_start_count == JOBS + 1, st.worker_start_count


def test_a_slow_task_feeding_a_fast_one_starts_no_job_per_block(out):
    """``b``'s blocks wait on ``a``'s, which come every 0.2 s (two jobs of ``a``, 0.4 s blocks):
    between blocks ``b``'s jobs wait longer than a job takes to start, and stay while ``a`` still
    hands out blocks; only behind ``a``'s last blocks in flight do they end and get replaced
    (``net/tail.py``). Ending them at every wait started a job per block (12 here)."""
    n = 12

    def task(tid, fn):
        return daisy_nb.Task(
            tid, Roi((0,), (10 * n,)), Roi((0,), (10,)), Roi((0,), (10,)), process_function=fn,
            read_write_conflict=False, max_workers=2, tracking_path=False,
        )  # fmt: skip

    pipeline = task("a", tailfns.slow_client) + task("b", tailfns.fast_client)
    states = daisy_nb.run_blockwise(pipeline, progress=False, summary=False, return_states=True)
    assert [states[t].completed_count for t in "ab"] == [n, n]
    assert states["a"].worker_start_count == 2
    assert states["b"].worker_start_count <= 6, f"b started {states['b'].worker_start_count} jobs for {n} blocks"
