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


def run_pipeline(n, jobs, retries):
    """``a`` and ``b`` (block ``i`` of ``b`` reads what block ``i`` of ``a`` wrote), ``n`` blocks and
    ``jobs`` worker functions each, running ``tailfns.pipe_a``/``pipe_b``; their states."""

    def task(tid, fn):
        return daisy_nb.Task(
            tid, Roi((0,), (10 * n,)), Roi((0,), (10,)), Roi((0,), (10,)), process_function=fn,
            read_write_conflict=False, max_workers=jobs, max_retries=retries, tracking_path=False,
        )  # fmt: skip

    return daisy_nb.run_blockwise(
        task("a", tailfns.pipe_a) + task("b", tailfns.pipe_b), progress=False, summary=False, return_states=True
    )


def times(out, prefix):
    """``{what: when}`` of the pipeline's notes ``<prefix><what>`` (``tailfns._pipe_note``)."""
    return {p.name[len(prefix) :]: float(p.read_text().split()[0]) for p in out.glob(prefix + "*")}


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


def test_no_job_waits_behind_an_upstream_straggler_that_has_run_longer_than_a_job_takes_to_start(out, monkeypatch):
    """``a``'s block 0 is a straggler (it runs until every job of ``b`` has ended); ``b``'s block 0
    waits on it. By the time ``b``'s jobs have run their other blocks, the straggler has run longer
    than a job takes to start (3 s in the queue) and 4 times ``a``'s median block time: no job of
    ``b`` waits for its pending block; they end at once instead of after a job's start
    (``net/tail.py``, "Behind stragglers"). When the straggler is done, one job of ``b`` is
    started for its last block."""
    n = 8
    monkeypatch.setenv("TAIL_QUEUE_SECS", str(QUEUE_SECS))
    monkeypatch.setenv("TAIL_B_JOBS", str(JOBS))

    states = run_pipeline(n, JOBS, retries=2)
    assert [states[t].completed_count for t in "ab"] == [n, n]
    done_a, done_b = times(out, "done_a_"), times(out, "done_b_")
    ended_a, ended_b = sorted(times(out, "ended_a_").values()), sorted(times(out, "ended_b_").values())
    assert done_a["0"] > max(ended_b[:JOBS]), "the straggler did not see b's first jobs end"
    assert max(ended_a) < done_a["0"] + QUEUE_SECS / 2, "a job of a outlived its task"
    # b's jobs ended soon after b's other blocks were done, though b's block 0 was still to come
    # (the rent would have held one for a job's start, over 3 s)
    last_other_b = max(t for s, t in done_b.items() if s != "0")
    assert max(ended_b[:JOBS]) - last_other_b < QUEUE_SECS / 2, (ended_b, last_other_b)
    assert states["b"].worker_start_count == JOBS + 1  # one job for the block behind the straggler
    assert states["a"].worker_start_count == JOBS and states["a"].worker_failure_count == 0


def test_a_downstream_job_that_its_slowed_upstream_cannot_feed_ends(out, monkeypatch):
    """``a`` and ``b`` have two jobs each and blocks of 0.1 s; ``a``'s block 0 runs until a job of
    ``b`` has ended, so ``a`` makes a block per 0.1 s while ``b``'s two jobs could take two. Once
    ``b``'s jobs have waited, together and beyond half a job, as long as a job takes to start, one
    is told to end while ``a`` still hands out blocks (``net/tail.py``, "Downstream jobs at the
    upstream's pace"), which lets the straggler finish; ``b`` is not given a job per block
    afterwards (the spawn plan counts what its busy job takes within a job's start)."""
    n = 60
    monkeypatch.setenv("TAIL_QUEUE_SECS", "0.3")
    monkeypatch.setenv("TAIL_B_JOBS", "1")

    states = run_pipeline(n, 2, retries=0)
    assert [states[t].completed_count for t in "ab"] == [n, n]
    done_a, ended_b = times(out, "done_a_"), sorted(times(out, "ended_b_").values())
    last_other_a = max(t for s, t in done_a.items() if s != "0")
    assert done_a["0"] - ended_b[0] < tailfns.PIPE_DEADLINE_SECS / 2, "the straggler waited out its deadline"
    assert ended_b[0] < last_other_a, "b's job ended only once a was drained"
    assert states["b"].worker_start_count <= 3, states["b"].worker_start_count
