"""The dask back-end's submission core (``daisy_nb/runtime/dask/core.py``) without a cluster.

A ``RuleBasedStateMachine`` plays the driver shell and a cluster against the real
Scheduler: batches submitted, started on workers, finished with random statuses,
erred, timed out, taken back from stuck workers, workers added, retired and lost at
any point, the clock moved on. After every step the core's ``validate()`` holds (each
block handed out in exactly one batch; blocks in batches equal the Scheduler's
processing count) and the futures the shell knows are exactly the core's batches;
every run then drains to the end. The end-to-end proof with a real ``LocalCluster``
is ``tests/test_dask.py``.
"""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import daisy_nb
from daisy_nb import Roi
from daisy_nb.errors import WorkerError
from daisy_nb.runtime.common.failures import AbandonReason
from daisy_nb.runtime.dask.core import (
    PULLBACK_SECS,
    AskQueued,
    AskRunning,
    Cancel,
    DaskTaskRun,
    Stop,
    Submission,
    Submit,
)


def noop(block):
    pass


def pipeline(conflict: bool, max_retries: int, restarts: int, timeout, skip_every: int, downstream: bool = True):
    skip = (lambda b: b.block_id[1] % skip_every == 0) if skip_every else None
    a = daisy_nb.Task(
        "a",
        Roi((0,), (14,)),
        Roi((0,), (3,)),
        Roi((1,), (1,)),
        process_function=noop,
        read_write_conflict=conflict,
        max_retries=max_retries,
        max_worker_restarts=restarts,
        timeout=timeout,
        check_function=skip,
        tracking_path=False,
    )
    b = daisy_nb.Task(
        "b",
        Roi((0,), (14,)),
        Roi((0,), (2,)),
        Roi((0,), (2,)),
        process_function=noop,
        max_retries=max_retries,
        max_worker_restarts=restarts,
        tracking_path=False,
    )
    return a + b if downstream else a


class SubmissionMachine(RuleBasedStateMachine):
    @initialize(
        conflict=st.booleans(),
        max_retries=st.integers(0, 2),
        restarts=st.integers(0, 2),
        timeout=st.sampled_from([None, 1.0]),
        skip_every=st.sampled_from([0, 3]),
        per_thread=st.integers(1, 2),
        max_batch=st.sampled_from([1, 3, 4096]),
    )
    def setup(self, conflict, max_retries, restarts, timeout, skip_every, per_thread, max_batch):
        self.s = daisy_nb.Scheduler(
            pipeline(conflict, max_retries, restarts, timeout, skip_every), block_tracking=False
        )
        trs = {tid: DaskTaskRun(self.s.tasks[tid]) for tid in self.s.task_ids}
        self.core = Submission(self.s, trs, target_secs=0.01, per_thread=per_thread, max_batch=max_batch)
        self.restarts = restarts
        self.workers = {"tcp://w0": 1, "tcp://w1": 2}
        self.next_worker = 2
        self.core.set_workers(self.workers)
        self.live: dict = {}  # the shell's futures: bid -> its Submit
        self.asked_running = None
        self.pending_queued = None
        self.now = 100.0

    # ------------------------------------------------------------ the shell
    def apply(self, actions):
        for a in actions:
            if isinstance(a, Submit):
                assert a.bid not in self.live
                b = self.core.batches[a.bid]
                assert b.tid == a.tid and a.packed.shape == (b.n, 6) and (a.packed[:, 0] == b.index).all()
                self.live[a.bid] = a
            elif isinstance(a, Cancel):
                for bid in a.bids:
                    assert self.live.pop(bid, None) is not None, bid
            elif isinstance(a, Stop):
                assert a.bids and all(bid not in self.core.batches for bid in a.bids)
            elif isinstance(a, AskRunning):
                self.asked_running = a.workers
            elif isinstance(a, AskQueued):
                self.pending_queued = a.workers
            else:
                raise AssertionError(a)

    def pick_live(self, data, started=None):
        bids = sorted(
            bid for bid in self.live if started is None or (self.core.batches[bid].t_start is not None) == started
        )
        return data.draw(st.sampled_from(bids)) if bids else None

    # ---------------------------------------------------------------- rules
    @rule()
    def submit(self):
        self.apply(self.core.submit(self.now))

    @rule(data=st.data())
    def start(self, data):
        bid = self.pick_live(data, started=False)
        if bid is not None:
            w = data.draw(st.sampled_from(sorted(self.workers))) if self.workers else "tcp://gone"
            self.core.started(bid, w, 1000 + bid, self.now)

    @rule(data=st.data(), init_error=st.booleans())
    def finish(self, data, init_error):
        bid = self.pick_live(data)
        if bid is None:
            return
        b = self.core.batches[bid]
        del self.live[bid]
        if init_error and data.draw(st.integers(0, 4)) == 0:
            result = {"init_error": "init_fn failed", "worker": b.worker or ""}
        else:
            st_ = data.draw(st.lists(st.sampled_from([0, 2, 2, 3]), min_size=b.n, max_size=b.n))
            failed = 3 in st_
            result = {
                "status": bytes(st_),
                "elapsed_ns": data.draw(st.integers(0, 10**8)),
                "first_error": WorkerError("ValueError", "first", "tb", 1, "a", " on x") if failed else None,
                "last_error": WorkerError("KeyError", "last", "tb", 2, "a", " on x") if failed else None,
                "init_error": None,
                "worker": b.worker or "",
            }
        self.apply(self.core.finished(bid, result))
        self.apply(self.core.end_pass())

    @rule(data=st.data())
    def err(self, data):
        bid = self.pick_live(data)
        if bid is not None:
            del self.live[bid]
            self.core.erred(bid, "KilledWorker", "the worker died")

    @rule()
    def end_pass(self):
        self.apply(self.core.end_pass())

    @rule()
    def add_worker(self):
        addr = f"tcp://w{self.next_worker}"
        self.next_worker += 1
        self.core.worker_added(addr)
        self.workers[addr] = 1
        self.core.set_workers(self.workers)

    @precondition(lambda self: self.workers)
    @rule(data=st.data(), expected=st.booleans())
    def remove_worker(self, data, expected):
        addr = data.draw(st.sampled_from(sorted(self.workers)))
        del self.workers[addr]
        self.apply(self.core.worker_removed(addr, expected=expected))
        self.core.set_workers(self.workers)

    @rule(dt=st.sampled_from([0.1, 0.6, 2.5, 40.0]))
    def clock(self, dt):
        self.now += dt
        self.pending_queued = None
        self.apply(self.core.tick(self.now))
        if self.pending_queued is not None:  # the shell asks dask which futures are queued there
            queued = [bid for bid in self.live if self.core.batches[bid].t_start is None]
            self.apply(self.core.queued(queued[::2]))

    @precondition(lambda self: self.asked_running is not None)
    @rule(data=st.data(), fail=st.booleans())
    def answer_running(self, data, fail):
        asked, self.asked_running = self.asked_running, None
        if fail:
            self.core.running(asked, None)
            return
        answer = {
            a: data.draw(st.lists(st.sampled_from(sorted(self.core.zombies[a])), unique=True))
            for a in asked
            if a in self.core.zombies
        }
        self.core.running(asked, answer)

    @precondition(lambda self: self.core.zombies)
    @rule(data=st.data())
    def zombie_ends(self, data):
        addr = data.draw(st.sampled_from(sorted(self.core.zombies)))
        self.core.batch_ended(data.draw(st.sampled_from(sorted(self.core.zombies[addr]))), addr)

    # ----------------------------------------------------------- invariants
    @invariant()
    def consistent(self):
        self.core.validate()
        assert set(self.live) == set(self.core.batches)
        for tid in self.s.task_ids:
            c = self.s.counters[tid]
            assert c.worker_restart_count <= self.restarts
            reason = AbandonReason.of(self.s.abandon_reason(tid))
            if reason is AbandonReason.RESTARTS:
                assert c.worker_restart_count == self.restarts
            assert self.s.is_abandoned(tid) == (reason is not None)

    def teardown(self):
        """Whatever happened, the run drains: every batch finished, every task done."""
        if not hasattr(self, "core"):
            return
        for _ in range(200):
            self.apply(self.core.submit(self.now))
            if not self.live:
                break
            for bid in sorted(self.live):
                b = self.core.batches[bid]
                del self.live[bid]
                self.apply(self.core.finished(bid, {"status": bytes([2] * b.n), "elapsed_ns": 1000, "worker": ""}))
            self.core.validate()
        assert self.s.is_done() and not self.core.batches
        assert not self.core.shutdown()


test_submission_core = SubmissionMachine.TestCase


def test_a_lost_worker_running_both_tasks_abandons_the_upstream_and_its_downstream_once():
    """A worker running batches of ``a`` and of its downstream ``b`` is lost with no restart left:
    ``a`` is abandoned, which orphans ``b`` and takes its batches; the loss is then not counted
    again for ``b`` (its batch on that worker is gone with the abandonment). Found by the
    machine above (a KeyError when ``b``'s batch was dropped twice)."""
    s = daisy_nb.Scheduler(pipeline(False, 0, 0, None, 0), block_tracking=False)
    trs = {tid: DaskTaskRun(s.tasks[tid]) for tid in s.task_ids}
    core = Submission(s, trs, target_secs=0.01, per_thread=2, max_batch=1)
    core.set_workers({"tcp://w0": 2, "tcp://w1": 2})

    def ok(bid):
        b = core.batches[bid]
        return {"status": bytes([2] * b.n), "elapsed_ns": 10**6, "first_error": None, "last_error": None,
                "init_error": None, "worker": b.worker}  # fmt: skip

    held = None  # one block of a, running on w1 until the end
    for _ in range(100):
        core.submit(100.0)
        for bid, b in sorted(core.batches.items()):
            if b.t_start is None:
                on = "tcp://w1" if (held is None and b.tid == "a") or b.tid == "b" else "tcp://w0"
                core.started(bid, on, 1000 + bid, 100.0)
                held = bid if held is None else held
        done = [bid for bid, b in core.batches.items() if b.worker == "tcp://w0"]
        for bid in done:
            core.finished(bid, ok(bid))
        core.end_pass()
        if not done:
            break
    on_w1 = {b.tid for b in core.batches.values() if b.worker == "tcp://w1"}
    assert on_w1 == {"a", "b"}, "the scenario needs batches of both tasks on the lost worker"
    out = core.worker_removed("tcp://w1", expected=False)
    assert s.is_abandoned("a") and s.is_abandoned("b") and not core.batches
    assert any(isinstance(x, Cancel) for x in out)
    assert s.counters["a"].worker_failure_count == 1 and s.counters["b"].worker_failure_count == 0
    core.validate()


def test_shutdown_gives_every_batch_back():
    s = daisy_nb.Scheduler(pipeline(False, 1, 1, None, 0), block_tracking=False)
    core = Submission(s, {t: DaskTaskRun(s.tasks[t]) for t in s.task_ids}, target_secs=0.1, per_thread=2, max_batch=4)
    core.set_workers({"tcp://w": 2})
    subs = core.submit(0.0)
    assert len(subs) == 4 and all(isinstance(a, Submit) for a in subs)
    assert s.processing_count("a") == sum(len(a.packed) for a in subs)
    acts = core.shutdown()
    assert sorted(b for a in acts for b in a.bids) == [a.bid for a in subs]
    assert s.processing_count("a") == 0 and s.ready_count("a") > 0  # given back, uncounted
    assert s.counters["a"].worker_failure_count == 0
    core.validate()


def test_lost_worker_after_finished_blocks_is_a_job_end_and_a_crash_meets_the_cap():
    s = daisy_nb.Scheduler(pipeline(False, 5, 0, None, 0, downstream=False), block_tracking=False)
    core = Submission(s, {t: DaskTaskRun(s.tasks[t]) for t in s.task_ids}, target_secs=1, per_thread=1, max_batch=1)
    core.set_workers({"tcp://w": 1})
    (first,) = core.submit(0.0)
    core.started(first.bid, "tcp://w", 7, 0.0)
    core.finished(first.bid, {"status": b"\x02", "elapsed_ns": 10, "worker": "tcp://w"})
    (second,) = core.submit(0.0)
    core.started(second.bid, "tcp://w", 7, 0.0)
    acts = core.worker_removed("tcp://w", expected=False)
    assert acts == [Cancel((second.bid,)), Stop("tcp://w", (second.bid,))]
    c = s.counters["a"]
    assert (c.worker_failure_count, c.worker_job_end_count, c.worker_restart_count) == (1, 1, 0)
    assert "was lost" in c.last_worker_error and "a job end" in c.last_worker_error
    assert not s.is_abandoned("a")
    # a worker that finished nothing: a crash; max_worker_restarts=0: the task and its downstream go
    core.worker_added("tcp://x")
    core.set_workers({"tcp://x": 1})
    (third,) = core.submit(1.0)
    core.started(third.bid, "tcp://x", 8, 1.0)
    core.worker_removed("tcp://x", expected=False)
    assert s.is_abandoned("a")
    assert AbandonReason.of(s.abandon_reason("a")) is AbandonReason.RESTARTS
    core.validate()
    assert core.submit(2.0) == []


def test_timeout_cancels_and_stops_the_batch_then_takes_back_what_is_queued_behind():
    s = daisy_nb.Scheduler(pipeline(False, 1, 5, 1.0, 0), block_tracking=False)
    core = Submission(s, {t: DaskTaskRun(s.tasks[t]) for t in s.task_ids}, target_secs=1, per_thread=2, max_batch=1)
    core.set_workers({"tcp://w": 1})
    late, queued = core.submit(0.0)
    core.started(late.bid, "tcp://w", 7, 0.0)
    assert core.tick(0.9) == []
    acts = core.tick(1.5)
    assert acts[:2] == [Cancel((late.bid,)), Stop("tcp://w", (late.bid,))]
    assert AskRunning(("tcp://w",)) in acts and AskQueued(("tcp://w",)) in acts
    assert s.counters["a"].timeout_reclaim_count == 1 and core.zombies == {"tcp://w": {late.bid}}
    assert core.slots() == 2  # its one thread is stuck: at least one thread's worth of futures
    assert core.queued([queued.bid]) == [Cancel((queued.bid,))]
    core.running(("tcp://w",), {"tcp://w": []})  # the stuck batch ended meanwhile
    assert core.zombies == {}
    assert core.tick(1.5 + PULLBACK_SECS) == []
    core.validate()


def test_a_batch_with_the_wrong_number_of_statuses_raises():
    s = daisy_nb.Scheduler(pipeline(False, 1, 1, None, 0), block_tracking=False)
    core = Submission(s, {t: DaskTaskRun(s.tasks[t]) for t in s.task_ids}, target_secs=1, per_thread=1, max_batch=2)
    core.set_workers({"tcp://w": 1})
    (sub,) = core.submit(0.0)
    assert len(sub.packed) == 1
    with pytest.raises(RuntimeError, match="returned 2 statuses"):
        core.finished(sub.bid, {"status": b"\x02\x02", "elapsed_ns": 1, "worker": ""})


class _Unreachable:
    """A dask client whose cluster is gone: every call to the scheduler fails."""

    status = "running"

    def scatter(self, *a, **k):
        raise OSError("Timed out trying to connect to tcp://scheduler:8786")


class _LostFuture:
    status = "lost"


def test_a_failed_rescatter_is_logged_once_with_its_traceback(caplog):
    """The scattered function lost with its workers is scattered again; when that fails the
    run says so (WARNING with the traceback once, DEBUG afterwards) instead of nothing."""
    import logging

    from daisy_nb.runtime.dask.driver import _log_once, _rescatter

    s = daisy_nb.Scheduler(pipeline(False, 1, 1, None, 0, downstream=False), block_tracking=False)
    client, logged = _Unreachable(), set()

    def log_once(what):
        _log_once(logged, what)

    tr = DaskTaskRun(s.tasks["a"])
    tr.serialize()
    tr.payload_arg = _LostFuture()
    caplog.set_level(logging.DEBUG, logger="daisy")
    _rescatter(client, tr, log_once)
    _rescatter(client, tr, log_once)
    recs = [r for r in caplog.records if "scatter the process_function of task 'a' again" in r.getMessage()]
    assert [r.levelname for r in recs] == ["WARNING", "DEBUG"]
    assert recs[0].exc_info and "Timed out trying to connect" in caplog.text
    tr.payload_arg = tr.payload  # inline payloads are never scattered
    _rescatter(client, tr, log_once)
    assert len([r for r in caplog.records if "scatter" in r.getMessage()]) == 2
