"""Retry backoff (``Task(retry_backoff=...)``, ``daisy_nb/scheduling/backoff.py``).

* the rule and the holding area against their slow twin (``tests/reference/backoff.py``), a
  hypothesis state machine with a fake clock and shared random draws, ``validate()`` after
  every step;
* the Scheduler with a fake clock against a plain model of one task's FIFO with held retries:
  the same blocks in the same order, counters that add up (a waiting block is pending), no
  block handed out before its retry time;
* real runs (the local pool, the TCP hand-out, the serial runner): a block that fails its first
  attempt starts again no sooner than the smallest delay after its failure (times the block
  function writes), the run completes, and the hang alarm stays quiet while it waits.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time

import backofffns
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from reference import backoff as ref

import daisy_nb as daisy
from daisy_nb import Roi, hang
from daisy_nb.scheduling import backoff as bo

# -- the rule -------------------------------------------------------------------------------


@given(
    base=st.floats(1e-3, 1e4), attempt=st.integers(1, 300), u=st.floats(0, 1, exclude_max=True),
)  # fmt: skip
def test_delay_rule_matches_its_twin_and_its_bounds(base, attempt, u):
    d = bo.retry_delay(base, attempt, u)
    assert d == ref.retry_delay(base, attempt, u)
    nominal = base * 2 ** min(attempt - 1, bo.MAX_DOUBLINGS)
    assert 0.5 * nominal <= d < 1.5 * nominal or math.isclose(d, 1.5 * nominal)


def test_delay_rule_examples():
    assert bo.retry_delay(1.0, 1, 0.5) == 1.0  # the nominal delay at the middle of the jitter
    assert bo.retry_delay(1.0, 3, 0.0) == 2.0  # 4 s nominal, the smallest factor
    assert bo.retry_delay(1.0, 6, 0.5) == bo.retry_delay(1.0, 60, 0.5) == 32.0  # capped


# -- the holding area against its twin --------------------------------------------------------


class BackoffMachine(RuleBasedStateMachine):
    """The fast holding area and its twin fed the same events, the same clock and the same draws."""

    @initialize(bases=st.lists(st.sampled_from([0.0, 0.01, 0.5, 3.0]), min_size=1, max_size=3), seed=st.integers(0, 99))
    def setup(self, bases, seed):
        self.fast = bo.RetryBackoff(bases, random.Random(seed).random)
        self.slow = ref.RetryBackoff(bases, random.Random(seed).random)
        self.now = 0.0
        self.nrows = 6

    @rule(data=st.data())
    def fail(self, data):
        t = data.draw(st.integers(0, len(self.fast.bases) - 1))
        row = data.draw(st.integers(0, self.nrows - 1))
        attempt = data.draw(st.integers(1, 8))
        held = any((e[2], e[3]) == (t, row) for e in self.slow.entries)
        if not self.fast.on(t) or held:
            with pytest.raises(ValueError):
                self.fast.failed(t, row, attempt, self.now)
            return
        assert tuple(self.fast.failed(t, row, attempt, self.now)) == self.slow.failed(t, row, attempt, self.now)

    @rule(dt=st.sampled_from([0.0, 0.001, 0.02, 0.3, 1.0, 10.0, 100.0]))
    def tick(self, dt):
        self.now += dt
        assert [tuple(r) for r in self.fast.due(self.now)] == self.slow.due(self.now)

    @precondition(lambda self: len(self.slow) > 0)
    @rule(data=st.data())
    def abandon(self, data):
        t = data.draw(st.integers(0, len(self.fast.bases) - 1))
        assert self.fast.drop_task(t) == self.slow.drop_task(t)

    @invariant()
    def agree(self):
        if not hasattr(self, "fast"):
            return
        self.fast.validate()
        assert self.fast.next_at() == self.slow.next_at()
        assert len(self.fast) == len(self.slow)
        assert [self.fast.held(t) for t in range(len(self.fast.bases))] == [
            self.slow.held(t) for t in range(len(self.fast.bases))
        ]
        nxt = self.fast.next_at()
        assert nxt is None or nxt > self.now  # everything due was taken out at the last tick


TestBackoffMachine = BackoffMachine.TestCase


def test_bad_draws_and_double_holds_are_refused():
    b = bo.RetryBackoff([1.0, 0.0], lambda: 1.0)
    with pytest.raises(ValueError, match="rng"):
        b.failed(0, 0, 1, 0.0)
    b = bo.RetryBackoff([1.0, 0.0], lambda: 0.0)
    with pytest.raises(ValueError, match="no retry backoff"):
        b.failed(1, 0, 1, 0.0)
    b.failed(0, 0, 1, 0.0)
    with pytest.raises(ValueError, match="held already"):
        b.failed(0, 0, 2, 0.0)
    b.validate()


# -- the Scheduler with a fake clock against a model of one task ------------------------------


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class _Model:
    """One task without dependencies: roots in order, then a FIFO; a failure with retries left
    waits ``ref.retry_delay`` and joins the back of the FIFO when due (before each hand-out)."""

    def __init__(self, n, max_retries, base, seed):
        self.fifo = list(range(n))
        self.failures = [0] * n
        self.max_retries, self.base = max_retries, base
        self.held = ref.RetryBackoff([base], random.Random(seed).random)
        self.running, self.done, self.failed = set(), set(), set()

    def acquire(self, now):
        self.fifo += [row for _, row in self.held.due(now)]
        if not self.fifo:
            return None
        row = self.fifo.pop(0)
        self.running.add(row)
        return row

    def release(self, row, ok, now):
        self.running.discard(row)
        if ok:
            self.done.add(row)
            return
        self.failures[row] += 1
        if self.failures[row] > self.max_retries:
            self.failed.add(row)
        else:
            self.held.failed(0, row, self.failures[row], now)


def _one_task(n, max_retries, base):
    return daisy.Task(
        "t", Roi((0,), (10 * n,)), Roi((0,), (10,)), Roi((0,), (10,)), read_write_conflict=False,
        max_retries=max_retries, retry_backoff=base, tracking_path=False,
    )  # fmt: skip


@given(
    n=st.integers(1, 12), max_retries=st.integers(0, 3), base=st.sampled_from([0.01, 0.5, 2.0]),
    seed=st.integers(0, 99), ops=st.lists(st.tuples(st.sampled_from("aaosft"), st.integers(0, 99)), max_size=80),
)  # fmt: skip
def test_scheduler_holds_failed_blocks_as_the_model_does(n, max_retries, base, seed, ops):
    s = daisy.Scheduler(_one_task(n, max_retries, base), block_tracking=False)
    clock = s._clock = _Clock()
    s._backoff._rng = random.Random(seed).random
    model = _Model(n, max_retries, base, seed)
    running: list = []  # blocks handed out, not released
    not_before: dict[int, float] = {}  # row -> the smallest retry time its failure allows

    def check():
        s._backoff.validate()
        c = s.counts("t")
        waiting = s.retry_waiting_count("t")
        assert waiting == len(model.held)
        assert c.processing == len(running) == len(model.running)
        assert c.ready + c.processing + c.completed + c.failed + waiting <= c.total  # waiting ones are pending
        assert (c.completed, c.failed) == (len(model.done), len(model.failed))
        st_ = s.task_states["t"]
        assert st_.pending_count == c.total - c.ready - c.processing - c.completed - c.failed >= waiting
        assert s.next_retry_at() == model.held.next_at()

    def acquire():
        b = s.acquire_block("t")
        row = model.acquire(clock.now)
        assert (None if b is None else b.index) == row
        if b is not None:
            assert clock.now >= not_before.pop(row, -math.inf)
            running.append(b)

    def release(k, ok):
        b = running.pop(k % len(running))
        b.status = daisy.BlockStatus.SUCCESS if ok else daisy.BlockStatus.FAILED
        s.release_block(b)
        model.release(b.index, ok, clock.now)
        if not ok and b.index not in model.failed:
            not_before[b.index] = clock.now + 0.5 * base * 2 ** min(model.failures[b.index] - 1, bo.MAX_DOUBLINGS)

    for op, k in ops:
        if op == "a":
            acquire()
        elif op in "osf" and running:
            release(k, ok=op in "os")
        elif op == "t":
            clock.now += [0.001, 0.1, 1.0, 5.0, 100.0][k % 5]
        check()
    # then to the end: every block finishes, nothing waits
    for _ in range(10 * n * (max_retries + 2)):
        while running:
            release(0, ok=True)
        clock.now += 1000.0
        acquire()
        check()
        if s.is_done():
            break
    assert s.is_done() and s.next_retry_at() is None
    assert s.counts("t").completed + s.counts("t").failed == n


def test_abandoning_a_task_lets_its_waiting_blocks_go_as_orphans():
    s = daisy.Scheduler(_one_task(3, 2, 1.0), block_tracking=False)
    s._clock = _Clock()
    b = s.acquire_block("t")
    b.status = daisy.BlockStatus.FAILED
    s.release_block(b)
    assert s.retry_waiting_count("t") == 1 and s.counts("t").processing == 0
    s.abandon_task("t", "test")
    assert s.retry_waiting_count("t") == 0 and s.next_retry_at() is None
    c = s.counts("t")
    assert c.orphaned == 3 and s.is_done()


def test_batch_release_holds_failures_and_keeps_the_rest():
    s = daisy.Scheduler(_one_task(4, 1, 1.0), block_tracking=False)
    clock = s._clock = _Clock()
    got = s.acquire_blocks("t", 4)
    s.release_blocks("t", got.index, [3, 2, 3, 0])  # fail, succeed, fail, give back
    c = s.counts("t")
    assert (c.ready, c.processing, c.completed) == (1, 0, 1) and s.retry_waiting_count("t") == 2
    assert s.acquire_blocks("t", 4).index.tolist() == [3]  # only the given-back block: the others wait
    clock.now += 1000.0
    assert sorted(s.acquire_blocks("t", 4).index.tolist()) == [0, 2]
    assert s.retry_waiting_count("t") == 0
    assert s.block_states("t").retries.tolist() == [1, 0, 1, 0]


def test_backoff_off_builds_no_holding_area():
    for off in (None, 0, 0.0):
        s = daisy.Scheduler(_one_task(2, 1, off), block_tracking=False)
        assert s._backoff is None and s.wake_retries() is None and s.next_retry_at() is None
        assert s.tasks["t"].retry_backoff == 0.0


def test_last_attempt_fails_for_good_without_waiting():
    s = daisy.Scheduler(_one_task(1, 0, 5.0), block_tracking=False)
    b = s.acquire_block("t")
    b.status = daisy.BlockStatus.FAILED
    s.release_block(b)
    assert s.counts("t").failed == 1 and s.retry_waiting_count("t") == 0 and s.is_done()


# -- real runs -------------------------------------------------------------------------------

BASE = 0.8  # seconds: the smallest delay after a first failure is 0.4 s


def _times(out, block):
    with open(os.path.join(out, f"t_{block}")) as f:
        return [(w, float(x)) for w, x in (line.split() for line in f)]


def _check_waited(out, base=BASE):
    for block in (0, 2):
        events = _times(out, block)
        assert [w for w, _ in events] == ["start", "fail", "start"], events
        waited = events[2][1] - events[1][1]
        assert waited >= 0.5 * base, f"block {block} retried {waited:.3f} s after its failure"
    for block in (1, 3):
        assert [w for w, _ in _times(out, block)] == ["start"]


def _run(out, caplog, monkeypatch, fn, **kw):
    caplog.set_level(logging.WARNING, logger="daisy")
    monkeypatch.setattr(hang, "CHECK_SECS", 0.05)  # the alarm looks often enough to see a 0.4 s wait
    task = daisy.Task(
        "b", Roi((0,), (40,)), Roi((0,), (10,)), Roi((0,), (10,)), process_function=fn, max_workers=2,
        max_retries=2, retry_backoff=BASE, tracking_path=False,
    )  # fmt: skip
    states = daisy.run_blockwise(
        task, progress=False, summary=False, return_states=True, hang_alarm={"secs": 0.2, "factor": 1}, **kw
    )
    st_ = states["b"]
    assert (st_.completed_count, st_.failed_count, st_.orphaned_count) == (4, 0, 0)
    _check_waited(str(out))
    # waiting for a retry is not hanging (an attempt itself may be slow on a busy machine: a dask
    # task took 1 s once, and the alarm rightly named it)
    alarms = [r for r in caplog.records if "no block finished" in r.getMessage()]
    assert not _while_waiting(str(out), alarms), [r.getMessage() for r in alarms]


def _while_waiting(out, records):
    """The log records made while block 0 or 2 waited for its retry, from its failure to its
    retry's start (a record's wall-clock time turned into the blocks' monotonic one)."""
    offset = time.time() - time.monotonic()
    windows = []
    for block in (0, 2):
        events = _times(out, block)
        windows.append((events[1][1], events[2][1]))
    return [r for r in records if any(lo < r.created - offset < hi for lo, hi in windows)]


def test_pool_retries_after_the_backoff(out, caplog, no_leaks, monkeypatch):
    _run(out, caplog, monkeypatch, backofffns.fail_first_attempt)


def test_tcp_clients_retry_after_the_backoff(out, caplog, no_leaks, monkeypatch):
    _run(out, caplog, monkeypatch, backofffns.client_loop)


def test_serial_retries_after_the_backoff(out, caplog, monkeypatch):
    _run(out, caplog, monkeypatch, backofffns.fail_first_attempt, multiprocessing=False)


def test_dask_retries_after_the_backoff(out, caplog, monkeypatch):
    pytest.importorskip("distributed")
    cloudpickle = pytest.importorskip("cloudpickle")
    from distributed import Client, LocalCluster

    cloudpickle.register_pickle_by_value(backofffns)  # the workers need not import tests/workers
    # started after ``out`` set DAISY_NB_TEST_OUT: the worker processes inherit it
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        _run(out, caplog, monkeypatch, backofffns.fail_first_attempt, executor=client)
