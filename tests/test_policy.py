"""The run policy the runtimes share (``daisy_nb/runtime/common/``).

A ``Task`` option is read in one place, the per-task run record, so the serial
runner, the pool and dask cannot interpret it differently: each runtime's record
is built from the same Task with the same fields and values.
"""

import datetime
import pickle
from types import SimpleNamespace

import pytest

import daisy_nb
from daisy_nb import Roi
from daisy_nb.runtime.common.batching import MAX_GROWTH, grow_batch
from daisy_nb.runtime.common.failures import (
    ABANDON_NOT_WAITING,
    ABANDON_RESTARTS,
    AbandonReason,
    TaskAbandonedError,
    abandon,
    count_worker_failure,
    crashes,
    is_job_end,
    raise_if_abandoned,
    record_error,
)
from daisy_nb.runtime.common.taskrun import TaskRun, elapsed_of, nothing_left
from daisy_nb.runtime.dask.core import DaskTaskRun
from daisy_nb.runtime.local import pool_parts as pool_rt
from daisy_nb.scheduler import WorkerCounters

RECORDS = [TaskRun, pool_rt.PoolTaskRun, DaskTaskRun]


def block_fn(block):
    pass


def worker_fn():
    pass


def worker_fn_ctx(*, context=None):
    pass


def opened():
    return "state"


def task(fn=block_fn, **kw):
    return daisy_nb.Task(
        "t",
        total_roi=Roi((0, 0), (40, 40)),
        read_roi=Roi((0, 0), (10, 10)),
        write_roi=Roi((0, 0), (10, 10)),
        process_function=fn,
        **kw,
    )


@pytest.mark.parametrize("cls", RECORDS, ids=["serial", "pool", "dask"])
def test_every_runtime_reads_the_task_options_alike(cls):
    t = task(
        timeout=datetime.timedelta(seconds=90),
        max_workers=3,
        max_worker_restarts=2,
        requires={"gpu": 1, "mem": 0},
        resource_tracking=True,
        init_fn=opened,
    )
    tr = cls(t)
    assert (tr.task, tr.tid, tr.fn, tr.init_fn) == (t, "t", block_fn, opened)
    assert (tr.arity, tr.wants_context, tr.ndim) == (1, False, 2)
    assert tr.timeout == 90.0
    assert (tr.max_workers, tr.max_restarts) == (3, 2)
    assert tr.requires == {"gpu": 1, "mem": 0}
    assert tr.track is True
    # the run-time counts start the same everywhere
    assert (tr.batch_k, tr.t_first, tr.t_done, tr.payload) == (1, None, None, None)
    # serialized once, with init_fn, the same bytes for every runtime
    assert pickle.loads(tr.serialize()) == (block_fn, opened)
    assert tr.payload == TaskRun(t).serialize()


def test_what_each_runtime_adds_is_derived_from_the_shared_fields():
    t = task(timeout=2.5, requires={"gpu": 1, "mem": 0}, resource_tracking=True)
    p, d = pool_rt.PoolTaskRun(t), DaskTaskRun(t)
    assert p.timeout_ns == 2_500_000_000
    assert d.resources == {"gpu": 1}  # dask resource restrictions: zero amounts are no restriction
    assert DaskTaskRun(task()).resources is None
    # the pool (and the serial runner) measure per-block stats; dask does not
    assert p.res is not None and p.res.task_id == "t"
    assert TaskRun(t).res is not None
    assert d.res is None
    assert pool_rt.PoolTaskRun(task()).res is None


def test_defaults_and_worker_functions():
    tr = TaskRun(task())
    assert tr.timeout == daisy_nb.task.DEFAULT_BLOCK_TIMEOUT_SECS
    assert (tr.max_workers, tr.max_restarts, tr.requires, tr.track, tr.init_fn) == (1, 10, {}, False, None)
    assert (TaskRun(task(worker_fn)).arity, TaskRun(task(worker_fn)).wants_context) == (0, False)
    assert (TaskRun(task(worker_fn_ctx)).arity, TaskRun(task(worker_fn_ctx)).wants_context) == (0, True)


@pytest.mark.parametrize("cap", [0, 1, 3])
def test_restart_cap_is_one_rule(cap):
    """The pool replaces a failed worker at its next spawn (``Restarts.started``), dask at the
    failure (``Restarts.replaced``); both stop after ``max_worker_restarts`` restarts, by the
    same rule (``Restarts.cap_reached``)."""
    for replace in ("started", "replaced"):
        tr = TaskRun(task(max_worker_restarts=cap))
        c = WorkerCounters()
        restarts = 0
        for _ in range(cap + 5):
            count_worker_failure(c, job_end=False)
            if tr.restarts.cap_reached(c):
                break
            getattr(tr.restarts, replace)(c)
            restarts += 1
        assert restarts == cap == c.worker_restart_count and c.worker_failure_count == cap + 1


def test_job_ends_are_counted_but_never_restarts():
    """Crashes and job ends interleaved, as dask sees them (its cluster replaces a lost worker, the run
    replaces a crash): only the crashes' replacements are restarts, and only they exhaust the cap;
    every dirty exit stays in ``worker_failure_count``. (The pool, which replaces job ends too, counts
    those replacements as restarts as the wheel does: tests/test_local_blocks.py.)"""
    tr = TaskRun(task(max_worker_restarts=2))
    c = WorkerCounters()
    for job_end in (True, False, True, True, False, True):
        count_worker_failure(c, job_end)
        assert not tr.restarts.cap_reached(c)
        if not job_end:  # what dask does with a crash
            tr.restarts.replaced(c)
        assert tr.restarts.crashes_replaced == crashes(c)
    assert (c.worker_failure_count, c.worker_job_end_count, c.worker_restart_count) == (6, 4, 2)
    count_worker_failure(c, job_end=True)  # the cap is used up: a job end is still replaced
    assert not tr.restarts.cap_reached(c)
    count_worker_failure(c, job_end=False)  # a third crash is not
    assert tr.restarts.cap_reached(c)


def test_what_is_a_job_end():
    import signal

    assert is_job_end(1) and is_job_end(4, returncode=1) and is_job_end(4, returncode=-signal.SIGKILL)
    assert is_job_end(1, returncode=-signal.SIGTERM)  # a walltime kill
    assert not is_job_end(0) and not is_job_end(0, returncode=-signal.SIGKILL)  # died before any block
    assert not is_job_end(4, crashed=True)  # a raised block or a timeout
    assert not is_job_end(4, returncode=-signal.SIGSEGV) and not is_job_end(4, returncode=-signal.SIGABRT)
    # what the batch system said ended the job (daisy_nb.launch): its own failure is a crash
    assert is_job_end(1, returncode=1, cause="TIMEOUT") and is_job_end(1, returncode=1, cause="PREEMPTED")
    assert is_job_end(1, returncode=1, cause="NODE_FAIL") and is_job_end(1, returncode=1, cause="CANCELLED")
    assert not is_job_end(4, returncode=1, cause="OUT_OF_MEMORY") and not is_job_end(4, returncode=1, cause="FAILED")
    assert not is_job_end(0, returncode=1, cause="TIMEOUT")  # a walltime shorter than any block would loop


def test_batch_growth():
    # 1 ms per block, 10 ms target: 10 blocks, reached in steps of at most MAX_GROWTH
    assert grow_batch(1, 1_000_000, 1, 0.01, 4096) == MAX_GROWTH
    assert grow_batch(4, 4_000_000, 4, 0.01, 4096) == 10
    assert grow_batch(10, 20_000_000, 10, 0.01, 4096) == 5  # slower blocks shrink it at once
    assert grow_batch(1000, 0, 1000, 0.01, 2048) == 2048  # too fast to measure: grow, up to the cap
    assert grow_batch(8, 10_000_000_000, 8, 0.01, 4096) == 1  # slow blocks go one at a time


def test_errors_and_elapsed():
    c = SimpleNamespace(first_worker_error=None, last_worker_error=None)
    record_error(c, "one")
    record_error(c, "two")
    assert (c.first_worker_error, c.last_worker_error) == ("one", "two")
    c = SimpleNamespace(first_worker_error=None, last_worker_error=None)
    record_error(c, "last", first="first")
    assert (c.first_worker_error, c.last_worker_error) == ("first", "last")
    tr = TaskRun(task())
    tr.t_first, tr.t_done = 10.0, 12.5
    assert elapsed_of({"t": tr}, ["t", "never"]) == {"t": 2.5, "never": 0.0}


def test_block_counts_have_one_owner_the_scheduler():
    """The shared record keeps no copy of the blocks in flight or of abandonment: they are derived."""
    tr = TaskRun(task())
    assert not hasattr(tr, "inflight") and not hasattr(tr, "abandoned")
    s = daisy_nb.Scheduler([task()], block_tracking=False)
    assert not nothing_left(s, "t")
    batch = s.acquire_blocks("t", 100)  # every ready block (the 16 blocks have no dependencies)
    assert len(batch.index) == 16 == s.processing_count("t")
    assert nothing_left(s, "t")  # all handed out
    s.release_blocks("t", batch.index[:3], [3, 3, 3])  # failed: retried, so ready again
    assert not nothing_left(s, "t")


def test_abandonment_is_one_routine_with_named_reasons():
    up = task()
    down = daisy_nb.Task(
        "d",
        total_roi=Roi((0, 0), (40, 40)),
        read_roi=Roi((0, 0), (10, 10)),
        write_roi=Roi((0, 0), (10, 10)),
        process_function=block_fn,
    )
    s = daisy_nb.Scheduler(up + down, block_tracking=False)
    s.acquire_blocks("t", 4)
    assert abandon(s, "t", AbandonReason.RESTARTS) == ["t", "d"]
    assert s.is_abandoned("t") and s.is_abandoned("d") and s.processing_count("t") == 0
    assert AbandonReason.of(s.abandon_reason("t")) is AbandonReason.RESTARTS
    assert AbandonReason.of(s.abandon_reason("d")) is AbandonReason.UPSTREAM
    assert abandon(s, "t", ABANDON_RESTARTS) == []  # once
    assert nothing_left(s, "t") and nothing_left(s, "d")
    with pytest.raises(ValueError):
        abandon(s, "d", AbandonReason.UPSTREAM)  # the scheduler's own reason
    with pytest.raises(ValueError):
        abandon(s, "t", "worker restart cap")  # a reason not in the enum
    assert (ABANDON_RESTARTS, ABANDON_NOT_WAITING) == ("worker restart cap exhausted", ABANDON_NOT_WAITING)
    assert f"({AbandonReason.NOT_WAITING})" == f"({ABANDON_NOT_WAITING})"
    # the run raises for the task whose workers failed, a RuntimeError carrying the states
    states = s.task_states
    states["t"].last_worker_error = "boom"
    with pytest.raises(RuntimeError) as e:
        raise_if_abandoned(states, ["t", "d"], "dask workers")
    err = e.value
    assert isinstance(err, TaskAbandonedError) and err.daisy_states is states and err.daisy_task_order == ["t", "d"]
    assert (err.task_id, err.reason, err.daisy_run_stats) == ("t", AbandonReason.RESTARTS, None)
    assert str(err).startswith("task 't' was abandoned (worker restart cap exhausted): dask workers failed 0 times")
    assert "16 blocks were orphaned. Last worker error: boom" in str(err)
    copy = pickle.loads(pickle.dumps(TaskAbandonedError("m", task_id="t", reason=ABANDON_RESTARTS)))
    assert (str(copy), copy.task_id, copy.reason) == ("m", "t", AbandonReason.RESTARTS)
    # downstream tasks alone raise nothing: their root's error says it
    raise_if_abandoned({"d": states["d"]}, ["d"])
