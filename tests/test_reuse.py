"""Block workers that serve the next task (``daisy_nb/runtime/local/reuse.py``).

The decisions against the real Scheduler without processes (a worker at its task's tail joins
the next task, waits for it, or quits), and real pipelines on worker processes: the downstream
tasks' blocks run in the upstream task's processes, each task's ``init_fn`` runs once per
worker of that task, ``DAISY_CONTEXT`` and the log files are the task's, a block that raises
in a moved worker is its new task's crash; ``DAISY_NB_REUSE_WORKERS=0`` and tasks with other
``requires`` get new processes. The core's state machine with reuse on is in
``test_local_blocks.py``.
"""

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from funlib.geometry import Roi

import daisy_nb
from daisy_nb.block import BlockStatus
from daisy_nb.runtime.local.blocks import BlockCore, Quit, Retask, SendBatch, WorkerState, check_tail
from daisy_nb.runtime.local.pool import run_pool

sys.path.insert(0, str(Path(__file__).parent / "workers"))

import reusefns  # noqa: E402

OK = np.full(1, BlockStatus.SUCCESS, np.uint8)


def pipeline(n_a, n_b, fn=reusefns.record, **kw):
    """``a -> b``, 1-D: block i of ``b`` reads and writes what block i of ``a`` writes."""
    tasks = []
    for tid, n in (("a", n_a), ("b", n_b)):
        tasks.append(
            daisy_nb.Task(
                tid,
                Roi((0,), (10 * n,)),
                Roi((0,), (10,)),
                Roi((0,), (10,)),
                process_function=fn,
                tracking_path=False,
                **kw,
            )
        )
    return daisy_nb.Scheduler(tasks[0] + tasks[1], block_tracking=False)


def core_of(s, max_workers=2, reuse=True):
    core = BlockCore(s, target_secs=0.01, capacity=64)
    for tid in s.task_ids:
        core.add_task(tid)
        core.reuse.add_task(tid, max_workers, s.task_ids if reuse else ())
    return core


def two_workers_of_a(max_workers=2, reuse=True):
    """``a -> b`` (2 blocks, 1 block), workers 0 and 1 of ``a`` ready: each runs one block of ``a``."""
    s = pipeline(2, 1)
    core = core_of(s, max_workers, reuse)
    for wid in (0, 1):
        core.add(wid, "a")
        assert isinstance(core.ready(wid)[0], SendBatch)
    return s, core


# ---------------------------------------------------------------- the decisions, no processes
def test_a_worker_at_its_tail_joins_the_next_task_with_ready_blocks():
    s, core = two_workers_of_a()
    # a0 done: b0 is ready, a has only a1 left, in flight; b has no worker: worker 0 moves
    assert core.batch_done(0, OK, 10**7) == [Retask(0, "b")]
    w = core.workers[0]
    assert (w.tid, w.state) == ("b", WorkerState.STARTING)
    assert core.alive("b") == 1 and core.alive("a") == 1 and core.waiting("b") == 1
    (sent,) = core.ready(0)  # its set-up for b is done: it takes b0
    assert isinstance(sent, SendBatch) and s.processing_count("b") == 1
    core.validate()


@pytest.mark.parametrize("max_workers", [1, 2])
def test_a_worker_waits_at_its_tail_for_the_next_task_then_joins_or_quits(max_workers):
    s, core = two_workers_of_a(max_workers)
    # a1 done first: b0 waits for a0 (in flight), so worker 1 has nothing to run; it waits for b
    assert core.batch_done(1, OK, 10**7) == []
    assert core.workers[1].state == WorkerState.PARKED and core.reuse.waits_for(core.workers[1]) == "b"
    check_tail(core)
    # a0 done: a is done, b0 ready: worker 0 moves at once
    assert core.batch_done(0, OK, 10**7) == [Retask(0, "b")]
    acts = core.dispatch_parked()
    if max_workers == 1:  # b has its one worker: the waiting one goes
        assert acts == [Quit(1)]
    else:  # room for a second worker of b, and b0 not handed out yet: it still waits
        assert acts == [] and core.workers[1].state == WorkerState.PARKED
        core.ready(0)  # worker 0 takes b0: nothing is left for b, the waiting worker goes
        assert core.dispatch_parked() == [Quit(1)]
    check_tail(core)
    core.validate()


def test_without_a_task_to_serve_a_worker_at_its_tail_quits():
    s, core = two_workers_of_a(reuse=False)
    assert core.batch_done(1, OK, 10**7) == [Quit(1)]
    assert core.batch_done(0, OK, 10**7) == [Quit(0)]


def test_a_waiting_worker_quits_when_the_task_it_waits_for_is_abandoned():
    s, core = two_workers_of_a()
    core.batch_done(1, OK, 10**7)
    assert core.workers[1].state == WorkerState.PARKED
    s.abandon_task("b", "test")
    assert core.dispatch_parked() == [Quit(1)]


def test_a_moved_worker_counts_only_for_its_new_task_and_dies_as_its_worker():
    s, core = two_workers_of_a()
    core.batch_done(0, OK, 10**7)  # moves to b
    core.ready(0)
    rep = core.exited(0, [np.array([BlockStatus.PROCESSING], np.uint8)], -9)
    assert rep.was_busy and s.ready_count("b") == 1 and s.processing_count("b") == 0  # b0's retry
    assert not core.of_task["b"] and core.alive("a") == 1
    core.validate()


# ---------------------------------------------------------------- real worker processes
def chain(n, fn=reusefns.record, requires=({"cpu": 1},) * 3, fns=None, **kw):
    """``a -> b -> c``, ``n`` blocks each (block i of each reads and writes [10 i, 10 i + 10)), with
    block function ``fn`` (or one per task: ``fns``)."""
    tasks = []
    for tid, req, f in zip("abc", requires, fns or (fn,) * 3):
        t = daisy_nb.Task(
            tid,
            Roi((0,), (10 * n,)),
            Roi((0,), (10,)),
            Roi((0,), (10,)),
            process_function=f,
            init_fn=reusefns.init,
            max_workers=2,
            requires=req,
            tracking_path=False,
            **kw,
        )
        tasks.append(t)
    return daisy_nb.Scheduler(tasks[0] + tasks[1] + tasks[2], block_tracking=False)


def run_chain(scheduler):
    try:
        return run_pool(scheduler, resources={"cpu": 2}, progress=False, summary=False)
    finally:
        scheduler.close()


def ran(out):
    """Per task, the worker pids that ran its blocks; and every block's (pid, task in DAISY_CONTEXT)."""
    pids: dict[str, set[int]] = {}
    for f in out.glob("ran_*"):
        _, tid, _ = f.name.split("_")
        for line in f.read_text().splitlines():
            pid, ctx_task = line.split()
            assert ctx_task == tid, f"a block of {tid} ran with DAISY_CONTEXT of {ctx_task}"
            pids.setdefault(tid, set()).add(int(pid))
    return pids


def inits(out):
    return Counter(tuple(line.split()) for line in (out / "inits").read_text().splitlines())


@pytest.mark.mp
@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("log_mode", ["file", "both"])
def test_a_pipeline_runs_on_the_first_tasks_workers(out, tmp_path, log_mode):
    import daisy_nb.logging as dlog

    dlog.set_log_mode(log_mode)
    try:
        states = run_chain(chain(8))
    finally:
        dlog.set_log_mode("file")
    assert all(states[t].completed_count == 8 and states[t].failed_count == 0 for t in "abc")
    pids = ran(out)
    assert len(pids["a"]) == 2 and pids["b"] <= pids["a"] and pids["c"] <= pids["a"]  # 2 processes in all
    assert all(states[t].worker_failure_count == 0 for t in "abc")
    assert states["b"].worker_start_count == len(pids["b"])  # a move counts as a worker start of b
    # init_fn: once per worker process of each task, with that task's DAISY_CONTEXT
    counts = inits(out)
    assert set(counts.values()) == {1}
    for tid, ps in pids.items():
        assert {(str(p), tid) for p in ps} <= set(counts), f"a worker ran {tid} without its init_fn"
    # the log files are the task's: b's output in b's files only
    logs = tmp_path / "logs"
    for tid in "abc":
        text = "".join(p.read_text() for p in (logs / tid).glob("*.out"))
        assert sorted(line.split()[-1] for line in text.splitlines() if line.startswith("hello")) == sorted(
            str(i) for i in range(8)
        ), f"{tid}'s log files hold {text!r}"


@pytest.mark.mp
@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize(
    "reuse, kw, moves",
    [
        ("off", {}, False),
        ("same", {"requires": ({"cpu": 1}, {"cpu": 2}, {"cpu": 1})}, False),  # b needs both cpus
        ("same", {"fns": (reusefns.record, reusefns.record_too, reusefns.record)}, False),  # by default
        ("any", {"fns": (reusefns.record, reusefns.record_too, reusefns.record)}, True),
    ],
)
def test_which_tasks_a_worker_moves_between(out, monkeypatch, reuse, kw, moves):
    """Off: every task's own processes. By default (``same``) only between tasks that run the same
    block function (a process keeps what another task's function left in it); ``any``: whatever
    the function, with the same ``requires``."""
    monkeypatch.setenv("DAISY_NB_REUSE_WORKERS", reuse)
    run_chain(chain(4, **kw))
    pids = ran(out)
    assert bool(pids["a"] & pids["b"]) == moves and bool(pids["b"] & pids["c"]) == moves


@pytest.mark.mp
@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leaks")
def test_a_block_that_raises_in_a_moved_worker_is_its_new_tasks_crash(out):
    states = run_chain(chain(6, fn=reusefns.record_raise_b1, max_retries=0))
    a, b, c = (states[t] for t in "abc")
    assert (a.completed_count, a.worker_failure_count) == (6, 0)
    assert (b.completed_count, b.failed_count, b.worker_failure_count) == (5, 1, 1)
    assert (c.completed_count, c.orphaned_count) == (5, 1)
    assert "block b1 fails" in (b.last_worker_error or "")


def test_a_moved_workers_timeline_row_shows_its_task_and_keeps_its_bars():
    from daisy_nb.dashboard.timeline import Timeline

    tl = Timeline()
    tl.worker(("w", 0), "a", "worker", "worker 0", 123, None, 0.0)
    tl.bar(("w", 0), "a", 0.0, 1.0)
    tl.moved(("w", 0), "b")
    tl.bar(("w", 0), "b", 1.0, 2.0)
    (row,) = tl.to_json(2.0, 0.0)["rows"]
    assert row["task"] == "b" and row["blocks"] == 2
    assert [b[2] for b in row["bars"]] == [0, 1]  # a's bar, then b's: each in its task's colour


@pytest.mark.mp
@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leaks")
def test_tracked_tasks_move_and_measure_every_block_of_each_task(out):
    """``resource_tracking`` tasks (per-block stats in the batches' shared memory) keep the layout
    across a move: every block of each task is measured once, in the task it belongs to."""
    states = run_chain(chain(6, resource_tracking=True))
    pids = ran(out)
    assert len(pids["a"]) == 2 and pids["b"] <= pids["a"] and pids["c"] <= pids["a"]
    for t in "abc":
        r = states[t].resource_stats
        assert r.blocks == 6 and r.failed == 0 and r.wall_seconds >= 6 * 0.01
