"""Backup copies of stragglers (``Task(speculative=...)``, ``daisy_nb/scheduling/speculation.py``).

* the rule and the bookkeeping of copies against their slow twin (``tests/reference/speculation.py``),
  a hypothesis state machine with a fake clock: the same events, the same candidates, the same
  outcomes, ``validate()`` after every step;
* the rules one by one: no backup before the median settles (two successes per running block,
  half the blocks, or a full window) or below ``k`` x the median, running blocks counted as
  longer than any in the first window's median, never a third copy, never next to a running neighbour,
  none in the bulk within the usual spread's 99th percentile, the first success wins and its
  twin is interrupted, one counted failure when both copies
  fail, a backup slow itself (past 2 x k medians and the window's far end) is stopped and its
  block runs on;
* the keyword: its accepted values and its errors (which name the task and the parameter).

Runs with real processes: ``test_giveback.py`` (the local pool), ``test_net_backups.py`` and
``test_client_backups.py`` (``Client`` jobs).
"""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from reference import speculation as ref

import daisy_nb as daisy
from daisy_nb import Roi
from daisy_nb.scheduling import speculation as sp
from daisy_nb.scheduling.speculation import Backup, Interrupt, Outcome

# -- the core against its twin ----------------------------------------------------------------


class SpeculationMachine(RuleBasedStateMachine):
    """The fast core and its twin fed the same events and the same clock."""

    @initialize(
        first=st.sampled_from([1.5, 3.0]), more=st.lists(st.sampled_from([None, 1.5, 3.0]), max_size=1),
        warm=st.sampled_from([0, 2, 5, 6, 6, 6]), data=st.data(),
    )  # fmt: skip
    def setup(self, first, more, warm, data):
        factors = [first, *more]
        totals = [data.draw(st.sampled_from([6, 9, 12, 30])), *(data.draw(st.integers(0, 12)) for _ in more)]
        self.fast = sp.Speculation(factors, totals)
        self.slow = ref.Speculation(factors, totals)
        self.tasks = [t for t, k in enumerate(factors) if k is not None]
        self.totals = totals
        self.now = 0.0
        self.next_copy = 0
        self._start(0, totals[0] - 1)  # often a straggler-to-be: started before the warm-up
        self._run_through(0, warm, 1.0)  # most runs begin past the median's MIN_SAMPLES

    def _start(self, t, row):
        ok = self.slow.may_start(t, row, self.next_copy)
        if ok:
            event("second copy" if self.slow.running(t).get(row) else "first copy")
            self.fast.started(t, row, self.next_copy, self.now)
            self.slow.started(t, row, self.next_copy, self.now)
        else:
            event("start refused")
            with pytest.raises(ValueError):
                self.fast.started(t, row, self.next_copy, self.now)
        self.next_copy += 1

    @rule(data=st.data(), n=st.integers(1, 3))
    def start(self, data, n):
        """First copies of up to ``n`` rows that neither run nor succeeded (what a hand-out gives)."""
        t = data.draw(st.sampled_from(self.tasks))
        for _ in range(n):
            busy = set(self.slow.running(t)) | set(self.slow.done_rows(t))
            free = [r for r in range(self.totals[t]) if r not in busy]
            if free:
                self._start(t, data.draw(st.sampled_from(free)))

    @rule(data=st.data(), idle=st.integers(0, 3), busy=st.sets(st.integers(0, 11), max_size=3), tail=st.booleans())
    def backup(self, data, idle, busy, tail):
        """Ask for candidates (the same of both; in the bulk or at the tail) and start a backup of one."""
        t = data.draw(st.sampled_from(self.tasks))
        got = self.fast.candidates(t, self.now, idle, busy.__contains__, tail)
        assert [tuple(b) for b in got] == self.slow.candidates(t, self.now, idle, busy.__contains__, tail)
        assert len(got) <= idle
        if got:
            event("a candidate")
            b = data.draw(st.sampled_from(got))
            self._start(b.task, b.row)

    @rule(data=st.data(), n=st.integers(1, 6), secs=st.sampled_from([0.5, 1.0, 2.0, 6.0]))
    def run_through(self, data, n, secs):
        """Up to ``n`` free rows start now and succeed ``secs`` later, one after the other (quick progress)."""
        self._run_through(data.draw(st.sampled_from(self.tasks)), n, secs)

    def _run_through(self, t, n, secs):
        for _ in range(n):
            busy = set(self.slow.running(t)) | set(self.slow.done_rows(t))
            free = [r for r in range(self.totals[t]) if r not in busy]
            if not free:
                return
            c = self.next_copy
            self._start(t, free[0])
            self.now += secs
            assert tuple(self.fast.finished(t, free[0], c, self.now, True)) == (True, None, False)
            self.slow.finished(t, free[0], c, self.now, True)

    @rule(data=st.data())
    def extra_copy(self, data):
        """A second (or third) copy of a running row, candidate or not: refused when it would be a third."""
        if not self.slow.live():
            return
        c = data.draw(st.sampled_from(sorted(self.slow.live())))
        t, row, _, _ = self.slow.live()[c]
        self._start(t, row)

    @rule(data=st.data(), ok=st.booleans(), lose=st.booleans())
    def end(self, data, ok, lose):
        """A live or stopping copy returns (ok or failed) or its worker dies."""
        ends = sorted(self.slow.live()) + self.slow.stopping()
        if not ends:
            return
        c = data.draw(st.sampled_from(ends))
        if lose:
            assert tuple(self.fast.lost(c)) == self.slow.lost(c)
            return
        t, row, _, _ = self.slow.live().get(c) or self.slow.replay()["stopping"][c]
        out = self.fast.finished(t, row, c, self.now, ok)
        assert isinstance(out, Outcome)
        assert tuple(out) == self.slow.finished(t, row, c, self.now, ok)
        event(f"end {'counts' if out.counts else 'dropped'}{' interrupt' if out.interrupt else ''}")

    @rule(data=st.data())
    def stop_slow_backups(self, data):
        """Backups that ran past k x the median themselves: the same of both, told to stop."""
        t = data.draw(st.sampled_from(self.tasks))
        far, med, k = self.fast.tasks[t].far_end(), self.fast.median(t), self.fast.tasks[t].factor
        got = self.fast.slow_backups(t, self.now)
        assert [tuple(i) for i in got] == self.slow.slow_backups(t, self.now)
        if got:
            event("a slow backup stopped")
            if far is not None and med is not None and far > sp.BACKUP_GIVE_UP * k * med:
                event("a slow backup stopped past the far end")

    @rule(dt=st.sampled_from([0.0, 0.5, 1.0, 1.0, 4.0, 20.0]))
    def tick(self, dt):
        self.now += dt

    @invariant()
    def agree(self):
        if not hasattr(self, "fast"):
            return
        self.fast.validate()
        assert self.fast.stopping() == self.slow.stopping()
        for t in range(len(self.totals)):
            assert self.fast.running(t) == self.slow.running(t)
            assert self.fast.can_back(t) == self.slow.can_back(t)
            attempt = self.slow.replay()["attempt"]
            for row, cs in self.slow.running(t).items():
                assert self.fast.is_backed(t, row) == (attempt[(t, row)] >= 2)
                for c in cs:
                    assert self.fast.alone(t, row, c) == (cs == [c] and attempt[(t, row)] == 1)
            assert self.fast.tasks[t].n_done == len(self.slow.done_rows(t))
            assert self.fast.median(t) == self.slow.median(t)
            assert self.fast.settled(t) == self.slow.settled(t)
            secs = [x for _, x in self.slow.replay()["done"][t]][-ref.WINDOW :]
            assert self.fast.tasks[t].median() == (ref.median(secs) if len(secs) >= ref.MIN_SAMPLES else None)
            assert self.fast.tasks[t].far_end() == self.slow.far_end(t)
            got = [tuple(b) for b in self.fast.candidates(t, self.now, 2, {1}.__contains__)]
            assert got == self.slow.candidates(t, self.now, 2, {1}.__contains__)
            if got:
                event("candidates after a step")
            tail = [tuple(b) for b in self.fast.candidates(t, self.now, 2, {1}.__contains__, at_tail=True)]
            assert tail == self.slow.candidates(t, self.now, 2, {1}.__contains__, True)
            assert set(got) <= set(tail), "the tail's rule copies no fewer blocks"
            if len(tail) > len(got):
                event("a candidate at the tail only")
            for at_tail in (False, True):
                self.check_next_due(t, at_tail)

    def check_next_due(self, t, at_tail):
        """``next_due``: no row becomes a candidate between now and then, one does just after it;
        with None, none ever does (with the state as it is)."""

        def rows(now):
            return {b.row for b in self.fast.candidates(t, now, 10**6, None, at_tail)}

        due, now = self.fast.next_due(t, self.now, at_tail), self.now
        if due is None:
            assert rows(now + 1e6) == rows(now)
            return
        event("a backup due later")
        assert due >= now
        assert rows(now + (due - now) / 2) == rows(now)
        assert rows(due + 1e-6) > rows(now), "nothing passed the limit at the time next_due named"


SpeculationMachine.TestCase.settings = settings(stateful_step_count=80)
TestSpeculationMachine = SpeculationMachine.TestCase


# -- the rules, one by one ----------------------------------------------------------------------


def _warm(total=10, n=5, secs=1.0, factor=3.0):
    """A task whose first ``n`` rows (0..n-1) succeeded in ``secs`` each; the clock is at 100."""
    s = sp.Speculation([factor], [total])
    for row in range(n):
        s.started(0, row, 100 + row, 0.0)
        assert s.finished(0, row, 100 + row, secs, True) == Outcome(True)
    return s


def test_no_backup_before_half_the_blocks():
    """A small task with many blocks running: half of its blocks settle its median."""
    s = _warm(total=12, n=5)  # 5 of 12 succeeded, 3 running: fewer than twice the running ones
    for row in (5, 6, 7):
        s.started(0, row, row, 0.0)
    assert s.tasks[0].median() == 1.0 and not s.settled(0)
    assert s.candidates(0, 1000.0, 4) == []
    s.started(0, 8, 8, 1000.0)
    s.finished(0, 8, 8, 1001.0, True)  # 6 of 12: half
    assert s.settled(0) and s.candidates(0, 1000.0, 4) == [Backup(0, 5, 5), Backup(0, 6, 6), Backup(0, 7, 7)]


def test_no_backup_before_the_median_is_known():
    s = _warm(total=8, n=4)  # past half, but only 4 block times
    s.started(0, 4, 1, 0.0)
    assert s.settled(0) and s.tasks[0].median() is None and s.median(0) is None
    assert s.candidates(0, 1000.0, 4) == []


def test_few_workers_back_up_after_two_blocks_each_not_a_window():
    """8 jobs of a task of 1,000 blocks: a slow first attempt started first gets its backup once
    16 blocks (two per job) succeeded, not after a window of 64: on a cluster with minute-long
    blocks that is two minutes of the job it holds instead of eight."""
    s = sp.Speculation([3.0], [1000])
    s.started(0, 999, 999, 0.0)  # the straggler, on job 0
    row, now = 0, 0.0
    for _ in range(15):  # jobs 1-7 run blocks of 1 s, one after the other
        s.started(0, row, row, now)
        s.finished(0, row, row, now + 1.0, True)
        row += 1
    for j in range(7):  # and one block each runs now
        s.started(0, row + j, row + j, 15.0)
    assert s.tasks[0].n_done == 15 and not s.settled(0)
    assert s.candidates(0, 15.5, 1) == []
    s.started(0, 500, 500, 14.0)
    s.finished(0, 500, 500, 15.0, True)  # the 16th success, 8 blocks running
    assert s.settled(0) and s.median(0) == 1.0
    assert s.candidates(0, 15.5, 1) == [Backup(0, 999, 999)]  # it has run 15.5 s, past 3 x 1 s
    s.validate()


def test_until_a_window_succeeded_running_blocks_count_as_longer_than_any():
    """The first blocks to succeed are a task's short ones: until a window of them succeeded, the
    rule's median counts every running block as longer than all (an upper bound of the median
    of the blocks started), so no block of the usual spread is copied for a median that is too short."""
    s = sp.Speculation([3.0], [1000])
    for row in range(16):  # 16 successes of 1, 2, ..., 16 s
        s.started(0, row, row, 0.0)
        s.finished(0, row, row, float(row + 1), True)
    for row in range(100, 108):  # 8 running
        s.started(0, row, row, 0.0)
    assert s.tasks[0].median() == 8.5  # of the successes alone
    assert s.median(0) == 12.5  # of 24 blocks, 8 of them longer than all: the 12th and 13th success
    assert s.candidates(0, 3 * 8.5 + 1, 8) == []  # 26.5 s: past 3 x 8.5, not past 3 x 12.5
    assert len(s.candidates(0, 3 * 12.5 + 0.1, 8)) == 8
    for row in range(108, 116):  # as many running as succeeded: the middle one is a running one
        s.started(0, row, row, 0.0)
    assert s.median(0) is None and s.candidates(0, 1000.0, 8) == []
    s.validate()


def test_a_full_window_settles_the_median_whatever_runs():
    """64 successes (a full window) settle a task's median even with more than 32 blocks running,
    and from then on its median is the window's, as after any number of successes."""
    s = _warm(total=1000, n=sp.WINDOW - 1)
    for row in range(900, 940):
        s.started(0, row, row, 0.0)
    assert not s.settled(0) and s.candidates(0, 1000.0, 4) == []
    s.started(0, 998, 2, 0.0)
    s.finished(0, 998, 2, 1.0, True)
    assert s.settled(0) and s.tasks[0].n_done == sp.WINDOW and s.median(0) == 1.0
    assert s.candidates(0, 1000.0, 2) == [Backup(0, 900, 900), Backup(0, 901, 901)]


def test_a_slow_backup_is_stopped_and_its_block_runs_on():
    """A backup that itself runs past 2 x k x the median means the block, not its attempt, is slow:
    the backup is stopped, the first copy runs on and decides, and the block gets no third copy."""
    s = _warm(factor=3.0)  # median 1 s
    s.started(0, 5, 1, 0.0)
    s.started(0, 5, 2, 4.0)  # the backup, at 4 s
    assert s.slow_backups(0, 8.0) == []  # 4 s: a block long anyway may still win
    assert s.slow_backups(0, 10.0) == []  # 6 s: exactly 2 x k x the median, not longer
    assert s.slow_backups(0, 10.5) == [Interrupt(0, 5, 2)]
    assert s.running(0) == {5: [1]} and s.stopping() == [2] and s.can_back(0) == 0
    assert s.slow_backups(0, 100.0) == [] and s.candidates(0, 100.0, 4) == []  # asked once; no other backup
    with pytest.raises(ValueError, match="third copy"):
        s.started(0, 5, 3, 8.0)
    s.validate()
    assert s.finished(0, 5, 2, 9.0, True) == Outcome(False, None, True)  # its late end counts for nothing
    assert s.finished(0, 5, 1, 10.0, True) == Outcome(True)  # the first copy decides, alone
    assert s.tasks[0].n_done == 6 and s.stopping() == []
    s.validate()
    s.started(0, 6, 4, 20.0)  # and when the first copy fails, the attempt ends with its failure
    s.started(0, 6, 5, 24.0)
    assert s.slow_backups(0, 31.0) == [Interrupt(0, 6, 5)]
    assert s.finished(0, 6, 4, 32.0, False) == Outcome(True)
    s.validate()  # the stopped backup's row neither runs nor succeeded: it was a slow backup
    assert s.lost(5) == Outcome(False, None, True)
    s.validate()


def _spread(secs, total=200, factor=3.0):
    """A task whose first rows succeeded in ``secs`` (one each, in order); the clock is at 0."""
    s = sp.Speculation([factor], [total])
    for row, x in enumerate(secs):
        s.started(0, row, 1000 + row, 0.0)
        s.finished(0, row, 1000 + row, x, True)
    return s


def test_the_far_end_is_the_windows_spread_carried_to_three_sigma():
    """The far end: the median times (q90 / median) ** (3 / z(0.9)), nearest rank, never the
    largest time: a tenth of the window (6 of 64), or one of five, may be outliers."""
    assert _spread([1.0] * 5).tasks[0].far_end() == 1.0
    assert _spread([1.0] * 4).tasks[0].far_end() is None  # no median yet
    assert _spread([1.0] * 5 + [10.0]).tasks[0].far_end() == 1.0  # the largest of six: an outlier
    assert _spread([1.0] * 58 + [50.0] * 6).tasks[0].far_end() == 1.0  # six of 64
    far = _spread([1.0] * 57 + [2.0] * 7).tasks[0].far_end()  # seven of 64 are the spread
    assert far == pytest.approx(2.0 ** (3 / 1.2815515655446004)) and 5.0 < far < 5.1
    # lognormal times (sigma 1, median 1): the far end is about three sigmas out, e**3 ~ 20
    z = [-1.8627, -1.5341, -1.318, -1.1503, -1.0364, -0.8871, -0.7764, -0.6745, -0.5978, -0.4888, -0.4125,
         -0.3186, -0.2533, -0.1573, -0.0627, 0.0, 0.0627, 0.1573, 0.2533, 0.3186, 0.4125, 0.4888, 0.5978,
         0.6745, 0.7764, 0.8871, 1.0364, 1.1503, 1.2816, 1.5341, 1.8627]  # fmt: skip
    s = _spread([math.exp(x) for x in z])
    assert 12.0 < s.tasks[0].far_end() < 25.0  # (the 28th of 31 is z = 1.15: 14.8)
    s.started(0, 40, 1, 0.0)
    s.validate()


def test_a_backup_of_a_block_long_anyway_runs_on_in_a_widely_spread_task():
    """Blocks spread as lognormal with sigma 1 often run past 2 x k medians: a backup of such a
    block, slow on its first attempt, is not stopped before the far end (about 20 medians),
    so it can win; a backup past the far end is stopped as before."""
    times = [1.0] * 20 + [3.0] * 8 + [8.0] * 4  # q90 is 8: far end 8 ** 2.34, about 130 medians
    s = _spread(times)
    assert s.median(0) == 1.0
    far = s.tasks[0].far_end()
    assert far == pytest.approx(8.0 ** (3 / 1.2815515655446004))
    s.started(0, 50, 1, 100.0)
    assert s.candidates(0, 103.5, 1, at_tail=True) == [Backup(0, 50, 1)]
    s.started(0, 50, 2, 103.5)  # the backup (at the tail: in the bulk it would come later, below)
    assert s.slow_backups(0, 103.5 + 7.0) == []  # past 2 x k x the median: it runs on
    assert s.slow_backups(0, 103.5 + far) == []
    assert s.finished(0, 50, 2, 103.5 + 9.0, True) == Outcome(True, Interrupt(0, 50, 1))  # and wins
    s.validate()
    narrow = _spread([1.0] * 32)  # a narrow spread keeps the 2 x k limit
    assert narrow.tasks[0].far_end() == 1.0
    narrow.started(0, 50, 1, 100.0)
    narrow.started(0, 50, 2, 103.5)
    assert narrow.slow_backups(0, 109.5) == [] and narrow.slow_backups(0, 109.6) == [Interrupt(0, 50, 2)]
    wide = _spread(times)
    wide.started(0, 50, 1, 100.0)
    wide.started(0, 50, 2, 103.5)
    assert wide.slow_backups(0, 103.5 + far + 0.01) == [Interrupt(0, 50, 2)]
    wide.validate()


def test_in_the_bulk_no_backup_within_the_usual_spread():
    """In the bulk of a task, a block gets a backup only once it has run past ``k`` medians and
    past the usual spread's 99th percentile (the window's spread carried on to 2.33 sigmas); at
    the tail, where a copy only takes a worker that would idle, 1.5 medians still do."""
    wide = _spread([1.0] * 20 + [2.0] * 8 + [4.0] * 4)  # q90 4: the 99th percentile 4 ** 1.815 ~ 12.4
    p99 = wide.tasks[0].usual(sp.Z_STRAGGLER)
    assert p99 == pytest.approx(4.0 ** (sp.Z_STRAGGLER / sp.Z_SPREAD)) and 12.0 < p99 < 13.0
    wide.started(0, 50, 1, 100.0)
    assert wide.candidates(0, 104.0, 1) == []  # past 3 medians, within the spread
    assert wide.next_due(0, 100.0) == pytest.approx(100.0 + p99)
    assert wide.candidates(0, 100.0 + p99 - 0.01, 1) == []
    assert wide.candidates(0, 100.0 + p99 + 0.01, 1) == [Backup(0, 50, 1)]
    assert wide.candidates(0, 101.6, 1, at_tail=True) == [Backup(0, 50, 1)]
    narrow = _spread([1.0] * 20 + [1.2] * 12)  # a narrow spread: k x the median decides
    assert narrow.tasks[0].usual(sp.Z_STRAGGLER) < 3.0
    narrow.started(0, 50, 1, 100.0)
    assert narrow.candidates(0, 103.0, 1) == [] and narrow.candidates(0, 103.01, 1) == [Backup(0, 50, 1)]


def test_no_backup_below_k_times_the_median():
    s = _warm(factor=3.0)  # median 1 s
    s.started(0, 5, 1, 10.0)
    assert s.candidates(0, 13.0, 1) == []  # exactly 3 x the median: not longer
    assert s.candidates(0, 13.001, 1) == [Backup(0, 5, 1)]
    assert s.candidates(0, 13.001, 0) == []  # no idle worker


def test_at_the_tail_a_copy_comes_after_one_and_a_half_medians():
    s = _warm(factor=3.0)  # median 1 s
    s.started(0, 5, 1, 10.0)
    assert s.candidates(0, 11.6, 1) == []  # in the bulk: 3 x the median
    assert s.candidates(0, 11.5, 1, at_tail=True) == []  # exactly 1.5 x: not longer
    assert s.candidates(0, 11.6, 1, at_tail=True) == [Backup(0, 5, 1)]
    s.started(0, 5, 2, 11.75)
    assert s.slow_backups(0, 17.75) == []  # the backup gives up after 2 x k medians, as in the bulk
    assert s.slow_backups(0, 17.875) == [Interrupt(0, 5, 2)]
    low = _warm(factor=1.2)  # a factor below the tail's stays
    low.started(0, 5, 1, 10.0)
    assert low.candidates(0, 11.1, 1, at_tail=True) == low.candidates(0, 11.1, 1) == []
    assert low.candidates(0, 11.3, 1, at_tail=True) == [Backup(0, 5, 1)]
    assert low.tasks[0].factor_now(at_tail=True) == 1.2 and s.tasks[0].factor_now(at_tail=True) == sp.TAIL_FACTOR


def test_oldest_first_and_at_most_one_per_idle_worker():
    s = _warm()
    for row, start in ((5, 3.0), (6, 1.0), (7, 2.0), (8, 1.0)):
        s.started(0, row, row, start)
    assert s.candidates(0, 100.0, 3) == [Backup(0, 6, 6), Backup(0, 8, 8), Backup(0, 7, 7)]  # ties: first started


def test_never_a_third_copy():
    s = _warm()
    s.started(0, 5, 1, 0.0)
    s.started(0, 5, 2, 50.0)  # the backup
    assert s.candidates(0, 1000.0, 4) == []  # two copies run: no candidate
    with pytest.raises(ValueError, match="third copy"):
        s.started(0, 5, 3, 60.0)
    assert s.finished(0, 5, 2, 70.0, False) == Outcome(False)  # the backup failed: the original decides
    assert s.candidates(0, 1000.0, 4) == []  # one copy runs, but this attempt had its backup
    with pytest.raises(ValueError, match="third copy"):
        s.started(0, 5, 3, 80.0)
    assert s.finished(0, 5, 1, 90.0, False) == Outcome(True)  # the attempt failed: the block may be retried
    s.started(0, 5, 4, 100.0)  # the retry is a new attempt, which may get a backup again
    assert s.candidates(0, 1000.0, 4) == [Backup(0, 5, 4)]
    s.validate()


def test_never_with_a_running_neighbour():
    s = _warm()
    s.started(0, 5, 1, 0.0)
    s.started(0, 6, 2, 0.0)
    assert s.candidates(0, 100.0, 4, {5}.__contains__) == [Backup(0, 6, 2)]
    assert s.candidates(0, 100.0, 1, {5}.__contains__) == [Backup(0, 6, 2)]  # a blocked row takes no worker
    assert s.candidates(0, 100.0, 4, lambda row: True) == []


def test_first_success_wins_and_the_loser_is_interrupted():
    s = _warm()
    s.started(0, 5, 1, 0.0)
    s.started(0, 5, 2, 10.0)
    assert s.finished(0, 5, 2, 12.0, True) == Outcome(True, Interrupt(0, 5, 1))  # the backup wins
    assert s.tasks[0].n_done == 6 and s.running(0) == {} and s.stopping() == [1]
    assert s.tasks[0]._secs[-1] == 2.0  # the winner's own run time
    s.validate()
    # the loser's end, whichever comes, counts for nothing and is no crash
    assert s.finished(0, 5, 1, 13.0, True) == Outcome(False, None, True)
    assert s.tasks[0].n_done == 6 and s.stopping() == []
    s.validate()


def test_a_killed_loser_is_lost_without_counting():
    s = _warm()
    s.started(0, 5, 1, 0.0)
    s.started(0, 5, 2, 10.0)
    assert s.finished(0, 5, 1, 11.0, True) == Outcome(True, Interrupt(0, 5, 2))  # the original wins
    assert s.lost(2) == Outcome(False, None, True)
    with pytest.raises(ValueError, match="not running"):
        s.lost(2)  # its end was reported
    s.validate()


def test_one_counted_failure_when_both_fail():
    for first in (1, 2):
        s = _warm()
        s.started(0, 5, 1, 0.0)
        s.started(0, 5, 2, 10.0)
        assert s.finished(0, 5, first, 11.0, False) == Outcome(False)  # dropped: the twin decides
        assert s.running(0) == {5: [3 - first]}
        assert s.finished(0, 5, 3 - first, 12.0, False) == Outcome(True)
        assert s.running(0) == {} and s.tasks[0].n_done == 5
        s.validate()


def test_a_failure_then_a_success_counts_the_success_only():
    s = _warm()
    s.started(0, 5, 1, 0.0)
    s.started(0, 5, 2, 10.0)
    assert s.lost(1) == Outcome(False)  # the original's worker died: the backup runs on
    assert s.finished(0, 5, 2, 11.0, True) == Outcome(True)
    assert s.tasks[0].n_done == 6 and s.stopping() == []
    s.validate()


def test_a_lone_copy_ends_as_without_backups():
    s = sp.Speculation([3.0], [3])
    s.started(0, 0, 1, 0.0)
    assert s.finished(0, 0, 1, 1.0, False) == Outcome(True)
    s.started(0, 0, 2, 2.0)
    assert s.lost(2) == Outcome(True)
    s.started(0, 0, 3, 3.0)
    assert s.finished(0, 0, 3, 4.0, True) == Outcome(True)
    with pytest.raises(ValueError, match="succeeded already"):
        s.started(0, 0, 4, 5.0)
    s.validate()


def test_the_window_keeps_the_last_64_times():
    s = sp.Speculation([2.0], [200])
    for row in range(100):
        s.started(0, row, row, 0.0)
        s.finished(0, row, row, 1.0 if row < 36 else 5.0, True)
    assert s.tasks[0].median() == 5.0  # the 36 short ones fell out of the window
    s.validate()


def test_bad_events_are_refused():
    s = sp.Speculation([None, 3.0], [2, 1])
    with pytest.raises(ValueError, match="no backups"):
        s.started(0, 0, 1, 0.0)
    s.started(1, 0, 1, 5.0)
    with pytest.raises(ValueError, match="in use"):
        s.started(1, 0, 1, 5.0)
    with pytest.raises(ValueError, match="not running row"):
        s.finished(1, 1, 1, 6.0, True)  # the wrong row
    with pytest.raises(ValueError, match="before its start"):
        s.finished(1, 0, 1, 4.0, True)
    with pytest.raises(ValueError, match="not running"):
        s.lost(7)
    assert s.candidates(0, 100.0, 4) == []  # a task without backups has none
    s.validate()
    with pytest.raises(ValueError, match="factor"):
        sp.Speculation([1.0], [3])
    with pytest.raises(ValueError, match="totals"):
        sp.Speculation([3.0], [3, 4])


def test_validate_catches_a_broken_state():
    s = _warm()
    s.started(0, 5, 1, 0.0)
    s._rows[0][5].append(1)  # one copy listed twice
    with pytest.raises(AssertionError):
        s.validate()
    s = _warm()
    s.tasks[0].n_done += 1
    with pytest.raises(AssertionError):
        s.validate()


# -- the keyword ----------------------------------------------------------------------------------


def _task(**kw):
    return daisy.Task("t", Roi((0,), (40,)), Roi((0,), (10,)), Roi((0,), (10,)), tracking_path=False, **kw)


@pytest.mark.parametrize(
    "value,factor",
    [(None, None), (False, None), (True, sp.DEFAULT_FACTOR), (1.5, 1.5), (4, 4.0), (1 + 1e-9, 1 + 1e-9)],
)
def test_speculative_values(value, factor):
    assert _task(speculative=value).speculative == factor


def test_speculative_is_off_by_default():
    assert _task().speculative is None


@pytest.mark.parametrize(
    "value,exc",
    [
        (0.5, ValueError), (1, ValueError), (1.0, ValueError), (0, ValueError), (-1, ValueError),
        (math.nan, ValueError), (math.inf, ValueError), ("3", TypeError), ([3.0], TypeError), (3j, TypeError),
    ],
)  # fmt: skip
def test_bad_speculative_values_name_the_task(value, exc):
    with pytest.raises(exc, match=rf"^Task {re.escape(repr('t'))}: speculative "):
        _task(speculative=value)
