"""Giving back a straggler's unstarted blocks (``daisy_nb/runtime/local/giveback.py``).

The core against a model of the worker's side of the protocol: the worker's steps are split
where the race lives (a block finishes and its status is written; then the worker reads its
batch's ``limit`` and starts the next block or stops), and the pool may look in between.
The model asserts what a user relies on: a block the pool gave back is never started by the
worker that held it (it would run twice), and every block the worker left is given back
(nothing is lost); :meth:`BlockCore.validate` runs after every step. Then real runs: a
straggler that waits for the blocks behind it in its batch finishes only because they were
given back, every block runs once, and the run's counters are those of a run without it.
"""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace

import numpy as np
import pytest
from funlib.geometry import Roi
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import daisy_nb
from daisy_nb.block import BlockStatus
from daisy_nb.runtime.local import pool
from daisy_nb.runtime.local.blocks import BlockCore, Drop, Kill, Quit, SendBatch
from daisy_nb.runtime.local.giveback import CONFIRM_NS, Cut, Running

CREATED, PROCESSING, SUCCESS, FAILED = (
    BlockStatus.CREATED,
    BlockStatus.PROCESSING,
    BlockStatus.SUCCESS,
    BlockStatus.FAILED,
)


def noop(block):
    pass


def scheduler(n: int, speculative=None) -> daisy_nb.Scheduler:
    t = daisy_nb.Task(
        "a",
        Roi((0,), (10 * n,)),
        Roi((0,), (10,)),
        Roi((0,), (10,)),
        process_function=noop,
        tracking_path=False,
        max_retries=1,
        speculative=speculative,
    )
    return daisy_nb.Scheduler([t], block_tracking=False)


class Slot:
    """A batch in the model worker's shared memory."""

    def __init__(self, rows: np.ndarray):
        self.rows = rows
        self.limit = len(rows)
        self.status = np.zeros(len(rows), np.uint8)
        self.start_ns: int | None = None  # when its first block started (the worker's clock of the batch)


class ModelWorker:
    """The worker's side: batches in run order, the running position, the block's start."""

    def __init__(self):
        self.slots: dict[int, Slot] = {}
        self.order: list[int] = []
        self.cur = -1  # position running (or just finished) in the oldest batch
        self.start_ns = 0
        self.between = True  # the running block's status is written; the limit not read yet
        self.decided: int | None = None  # the limit was read: the position to start next (-1: stop)
        self.killed = False  # the pool killed its process: it exits at the model's next reap
        self.drop: tuple[int, int] | None = None  # (slot, position): a drop signal on its way
        self.dropped = 0  # blocks a drop interrupted (the worker ran on)

    def running(self) -> bool:
        return not self.between and self.decided is None


class GiveBackMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.s = None
        self.core = None
        self.w: dict[int, ModelWorker] = {}
        self.now = 10**12
        self.next_wid = 0
        self.ran: dict[int, int] = {}  # row -> attempts started
        self.in_hypothesis = True  # False when a plain test drives the machine
        self.spawns = True  # the pool starts workers for ready blocks nobody takes
        self.snapshot = None  # what the pool read of the running blocks, before it decides

    @initialize(
        n=st.one_of(st.integers(2, 16), st.integers(2, 200)),
        workers=st.integers(1, 3),
        speculative=st.sampled_from([None, 2.0]),
    )
    def start(self, n, workers, speculative=None):
        self.s = scheduler(n, speculative)
        self.core = BlockCore(self.s, target_secs=0.001, capacity=16)
        self.core.add_task("a")
        for _ in range(workers):
            self.spawn()

    def note(self, what: str) -> None:
        if self.in_hypothesis:
            event(what)

    def spawn(self):
        wid, self.next_wid = self.next_wid, self.next_wid + 1
        self.w[wid] = ModelWorker()
        self.core.add(wid, "a")
        self.apply(self.core.ready(wid))

    def apply(self, actions):
        for a in actions:
            if isinstance(a, SendBatch):
                w = self.w[a.wid]
                assert a.slot not in w.slots
                w.slots[a.slot] = Slot(np.array(a.blocks.index, dtype=np.int64))
                w.order.append(a.slot)
            elif isinstance(a, Cut):
                self.note("cut")
                sl = self.w[a.wid].slots[a.slot]
                assert a.keep < sl.limit, "a cut that gives nothing back"
                sl.limit = a.keep
            elif isinstance(a, Drop):
                self.note("a losing copy's drop sent")
                self.w[a.wid].drop = (a.slot, a.pos)
            elif isinstance(a, Kill):
                self.note("a copy's worker killed")
                self.w[a.wid].killed = True
            elif isinstance(a, Quit):
                pass
            else:
                raise AssertionError(a)

    def busy(self):
        return [wid for wid, w in sorted(self.w.items()) if w.order]

    def core_rows(self, wid: int, slot: int) -> int:
        """How many rows of ``slot`` the core still counts as ``wid``'s."""
        for k, rows in self.core.workers[wid].queue:
            if k == slot:
                return len(rows)
        raise AssertionError(f"worker {wid} runs slot {slot}, which the core does not list")

    @rule(data=st.data(), fail=st.booleans())
    @precondition(lambda self: self.s is not None and any(w.running() for w in self.w.values()))
    def block_finishes(self, data, fail):
        wid = data.draw(st.sampled_from([wid for wid, w in sorted(self.w.items()) if w.running()]))
        w = self.w[wid]
        w.slots[w.order[0]].status[w.cur] = FAILED if fail else SUCCESS
        w.between = True

    @rule(data=st.data())
    @precondition(lambda self: self.s is not None and any(w.drop is not None for w in self.w.values()))
    def drop_signal_arrives(self, data):
        self.land_drop(data.draw(st.sampled_from([wid for wid, w in sorted(self.w.items()) if w.drop is not None])))

    def land_drop(self, wid: int) -> None:
        """The drop signal reaches worker ``wid``: it interrupts the block only if that block still
        runs (status CREATED, the batch ends there, the worker runs on); before or after it, the
        signal is ignored (the pool sends it again at its next look)."""
        w = self.w[wid]
        slot, pos = w.drop
        w.drop = None
        if w.order and w.order[0] == slot and w.cur == pos and w.running():
            self.note("a drop interrupted its block")
            w.slots[slot].status[pos] = CREATED
            w.between = True
            w.dropped += 1
        else:
            self.note("a drop came before or after its block")

    @rule(data=st.data())
    @precondition(lambda self: self.s is not None and any(w.between and w.order for w in self.w.values()))
    def worker_reads_limit(self, data):
        self.read_limit(data.draw(st.sampled_from([wid for wid in self.busy() if self.w[wid].between])))

    @rule(data=st.data())
    @precondition(lambda self: self.s is not None and any(w.decided is not None for w in self.w.values()))
    def worker_acts(self, data):
        self.act(data.draw(st.sampled_from([wid for wid, w in sorted(self.w.items()) if w.decided is not None])))

    def read_limit(self, wid: int) -> None:
        """The worker reads its batch's limit and decides: the next block, or the batch is done
        (what it decided, it does at its next step: the pool may look in between)."""
        w = self.w[wid]
        sl = w.slots[w.order[0]]
        i = w.cur + 1
        w.decided = i if i < len(sl.rows) and i < sl.limit else -1
        w.between = False

    def act(self, wid: int) -> None:
        w = self.w[wid]
        k = w.order[0]
        sl = w.slots[k]
        i, w.decided = w.decided, None
        if i >= 0:
            # (the loser of a race of copies, killed or being dropped, may start the block cut from it: its
            # end counts for nothing)
            dropping = wid in self.core.backups.dropping
            assert i < self.core_rows(wid, k) or w.killed or dropping, (
                f"worker {wid} starts row {sl.rows[i]}, which was given back"
            )
            sl.status[i] = PROCESSING
            w.cur, w.start_ns = i, self.now
            sl.start_ns = self.now if sl.start_ns is None else sl.start_ns
            self.ran[int(sl.rows[i])] = self.ran.get(int(sl.rows[i]), 0) + 1
            return
        n = self.core_rows(wid, k)  # the shell reads as many statuses as the core lists
        statuses = sl.status[:n].copy()
        if w.cur + 1 < len(sl.rows):
            self.note("the worker stopped at a lowered limit")
        w.order.pop(0)
        del w.slots[k]
        if w.drop is not None and w.drop[0] == k:  # the next batch in this slot starts with no drop
            w.drop = None
        w.cur, w.between = -1, True
        elapsed = max(1, self.now - (self.now if sl.start_ns is None else sl.start_ns))  # the batch's run time
        self.apply(self.core.batch_done(wid, statuses, elapsed, now_ns=self.now))

    @rule(secs=st.sampled_from([0.0, 0.001, 0.003, 0.05, 1.0, 10.0]))
    @precondition(lambda self: self.s is not None)
    def look(self, secs):
        """The pool's look at the running blocks (``CHECK_SECS``), after some time."""
        self.read(secs)
        self.decide()

    @rule(secs=st.sampled_from([0.0, 0.003, 0.05]))
    @precondition(lambda self: self.s is not None and self.snapshot is None)
    def pool_reads(self, secs):
        """The pool reads the shared memory; the workers may move on before it decides."""
        self.read(secs)

    @rule()
    @precondition(lambda self: self.s is not None and self.snapshot is not None)
    def pool_decides(self):
        self.decide()

    def read(self, secs: float) -> None:
        self.now += int(secs * 1e9)
        running = {}
        for wid in self.busy():
            w = self.w[wid]
            if w.cur >= 0 and w.order:
                sl = w.slots[w.order[0]]
                running[wid] = Running(w.cur, w.start_ns, int(sl.status[w.cur]))
        self.snapshot = (self.now, running)

    def decide(self) -> None:
        now, running = self.snapshot
        self.snapshot = None
        running = {wid: r for wid, r in running.items() if wid in self.core.workers}
        self.apply(self.core.straggling(now, running))
        self.apply(self.core.dispatch_parked())
        if self.spawns and self.s.ready_count("a") and not self.core.waiting("a") and len(self.core.workers) < 4:
            self.spawn()

    @rule(data=st.data())
    @precondition(lambda self: self.s is not None and any(w.killed for w in self.w.values()))
    def killed_worker_exits(self, data):
        self.reap(data.draw(st.sampled_from([wid for wid, w in sorted(self.w.items()) if w.killed])))

    def reap(self, wid: int) -> None:
        """A killed worker's process is gone: the pool reads what its batches' statuses say."""
        w = self.w.pop(wid)
        statuses = [w.slots[k].status[: self.core_rows(wid, k)].copy() for k in w.order]
        before = self.s.counters["a"].worker_failure_count
        rep = self.core.exited(wid, statuses, -9)
        assert rep.kind.name == "STOPPED", "the loser of a race of copies counts as a crash"
        assert self.s.counters["a"].worker_failure_count == before

    @invariant()
    def valid(self):
        if self.core is None:
            return
        self.core.validate()
        for wid, w in self.w.items():
            if wid in self.core.workers:
                assert [k for k, _ in self.core.workers[wid].queue] == w.order

    def teardown(self):
        """Every worker runs to the end: the run finishes, no block ran more often than its attempts."""
        if self.core is None:
            return
        for _ in range(100_000):
            if self.s.is_done():
                break
            self.look(10.0)  # running blocks are stragglers now: backups of speculative tasks
            for wid in [wid for wid, w in sorted(self.w.items()) if w.killed]:
                self.reap(wid)
            busy = self.busy()
            for wid in busy:
                w = self.w[wid]
                if w.running():
                    w.slots[w.order[0]].status[w.cur] = SUCCESS
                    w.between = True
                if w.between:
                    self.read_limit(wid)
                self.act(wid)
            if not busy:
                self.look(1.0)
        assert self.s.is_done(), "the run did not finish"
        c = self.s.task_states["a"]
        assert c.completed_count + c.failed_count == c.total_block_count
        copies = 2 if self.s.tasks["a"].speculative else 1
        assert all(v <= 2 * copies for v in self.ran.values()), "a block ran more often than its attempts"


GiveBackMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=80, deadline=None)
TestGiveBack = GiveBackMachine.TestCase


def finish_block(m: GiveBackMachine, wid: int) -> None:
    w = m.w[wid]
    w.slots[w.order[0]].status[w.cur] = SUCCESS
    w.between = True


def straggling_worker(n: int = 40) -> tuple[GiveBackMachine, int]:
    """One worker whose first batch ran (the task's time per block is measured) and whose
    second batch runs its first block, long enough to be a straggler."""
    m = GiveBackMachine()
    m.in_hypothesis = False
    m.start(n=n, workers=1)
    m.spawns = False
    wid = 0
    m.read_limit(wid)
    m.act(wid)  # block 0 starts
    finish_block(m, wid)
    m.read_limit(wid)
    m.act(wid)  # the first batch (one block) is done; the next batch is sent
    m.read_limit(wid)
    m.act(wid)  # its first block starts
    w = m.w[wid]
    assert len(w.slots[w.order[0]].rows) > 1, "the test needs a batch with blocks behind the running one"
    return m, wid


def test_a_straggler_gives_back_the_blocks_behind_it():
    m, wid = straggling_worker()
    w = m.w[wid]
    held = sum(len(w.slots[k].rows) for k in w.order) - 1  # behind the running block, a batch sent ahead too
    ready = m.s.ready_count("a")
    m.read(1.0)
    m.decide()  # cut
    assert [w.slots[k].limit for k in w.order] == [1, 0][: len(w.order)]
    m.read(0.05)
    m.decide()  # confirmed: the block still runs
    assert [m.core_rows(wid, k) for k in w.order] == [1, 0][: len(w.order)]
    assert m.s.ready_count("a") == ready + held
    assert m.core.tasks["a"].given_back == held
    finish_block(m, wid)
    m.read_limit(wid)
    m.act(wid)  # the worker stops at the limit: its batch is done with one block
    m.teardown()


def test_a_block_that_finishes_as_it_is_cut_keeps_its_batch():
    """The race: the pool reads "running", the block finishes, the worker reads the old limit,
    then the pool cuts. The pool's next look sees the block finished: nothing is given back
    early, and the worker runs the blocks it already decided to run."""
    m, wid = straggling_worker()
    w = m.w[wid]
    k = w.order[0]
    n = len(w.slots[k].rows)
    m.read(1.0)  # the pool reads: a straggler
    finish_block(m, wid)
    m.read_limit(wid)  # the worker decided to start the next block (the limit is not lowered yet)
    m.decide()  # the pool cuts
    assert w.slots[k].limit == 1
    m.read(0.05)
    m.decide()  # and looks again, past CONFIRM_NS: the block is not running any more
    assert m.core_rows(wid, k) == n, "blocks given back that the worker may start"
    m.act(wid)  # it starts block 1 (it read the limit before the cut)
    assert w.cur == 1
    m.teardown()


def test_a_cut_is_trusted_only_after_the_confirmation_time():
    m, wid = straggling_worker()
    w = m.w[wid]
    k = w.order[0]
    n = len(w.slots[k].rows)
    m.read(1.0)
    m.decide()
    m.read(CONFIRM_NS / 2 / 1e9)
    m.decide()
    assert m.core_rows(wid, k) == n
    m.read(CONFIRM_NS / 1e9)
    m.decide()
    assert m.core_rows(wid, k) == 1
    m.teardown()


@pytest.mark.parametrize("slow", [False, True], ids=["fast_blocks", "slow_blocks"])
def test_pool_runs_the_blocks_a_straggler_held_on_another_worker(out, caplog, no_leaks, slow):
    """Real worker processes: the straggler waits for every other block, so the run finishes only
    because the blocks behind it (in its batch, and a batch sent ahead; for blocks slower than
    the batch target, the one block sent ahead) were given back and run by the other worker;
    every block ran once and counts once."""
    import givebackfns as g

    n = g.N_SLOW if slow else g.N
    fn = g.slow_straggler_waits_for_the_rest if slow else g.straggler_waits_for_the_rest
    caplog.set_level(logging.DEBUG, logger="daisy")
    task = daisy_nb.Task(
        "g", Roi((0,), (10 * n,)), Roi((0,), (10,)), Roi((0,), (10,)),
        process_function=fn, max_workers=2, max_retries=0, tracking_path=False,
    )  # fmt: skip
    states = daisy_nb.run_blockwise(task, progress=False, summary=False, return_states=True)
    s = states["g"]
    assert (s.completed_count, s.failed_count, s.orphaned_count) == (n, 0, 0)
    done = sorted(int(f.split(".")[0]) for f in os.listdir(out / "done"))
    assert done == list(range(n)), "a block ran twice, or never"
    back = [r.getMessage() for r in caplog.records if "given back" in r.getMessage()]
    assert back and all("behind a block running" in m for m in back)


def step_unless_straggling(m: GiveBackMachine, wid: int, straggling: bool) -> None:
    """Worker ``wid`` ends its running block (unless it is the straggler, which runs on), reads
    its limit and acts on it."""
    w = m.w[wid]
    if straggling and w.running():
        return
    if w.running():
        finish_block(m, wid)
    if w.between:
        m.read_limit(wid)
    if w.decided is not None:
        m.act(wid)


def backed_up_straggler(n: int = 12) -> tuple[GiveBackMachine, int, int, int]:
    """A speculative task (factor 2) whose every block but one finished: the straggler's worker,
    the worker that runs its backup, and the straggler's row."""
    m = GiveBackMachine()
    m.in_hypothesis = False
    m.start(n=n, workers=2, speculative=2.0)
    slow = None
    for _ in range(1000):
        for wid in list(m.busy()):
            w = m.w[wid]
            if slow is None and w.cur >= 0 and w.running() and m.s.ready_count("a") == 0:
                slow = (wid, int(w.slots[w.order[0]].rows[w.cur]))
            step_unless_straggling(m, wid, slow is not None and wid == slow[0])
        m.look(0.01)
        twins = m.core.backups.twins
        if slow is not None and (("a", slow[1]) in twins):
            (copy_wid,) = twins[("a", slow[1])] - {slow[0]}
            return m, slow[0], copy_wid, slow[1]
    raise AssertionError("no backup was launched")


def counts(m):
    m.valid()  # every block in flight once, the copied one in its two copies' batches
    c = m.s.counts("a")
    return c.completed, c.failed, c.processing, c.ready


def test_the_backup_that_succeeds_first_wins_and_the_straggler_is_stopped():
    """The copy wins: the straggler's block is cut from its batch and dropped by a signal; its
    worker runs on (what its ``init_fn`` loaded kept), and its batch's end counts nothing again."""
    m, orig, copy, row = backed_up_straggler()
    done, failed, busy, ready = counts(m)
    m.read_limit(copy)
    m.act(copy)  # the copy starts the block
    finish_block(m, copy)
    m.read_limit(copy)
    m.act(copy)  # and reports it done first
    assert counts(m) == (done + 1, failed, busy - 1, ready)
    assert not m.w[orig].killed and not m.w[copy].killed
    assert m.w[orig].slots[m.w[orig].order[0]].limit == m.w[orig].cur, "the straggler's block was not cut from it"
    assert m.w[orig].drop == (m.w[orig].order[0], m.w[orig].cur), "the straggler's block is not dropped"
    m.land_drop(orig)
    m.read_limit(orig)
    m.act(orig)  # its batch ends where the block was dropped: nothing of it counts again
    assert m.w[orig].dropped == 1 and orig in m.core.workers and not m.core.backups.dropping
    assert counts(m) == (done + 1, failed, busy - 1, ready)
    m.teardown()
    assert counts(m) == (12, 0, 0, 0)


def test_a_drop_that_does_not_stop_the_block_is_sent_again_then_the_worker_is_killed():
    """The straggler's body ignores the drop (a signal that came before its code ran, or C code
    that does not return): the drop is sent again at every look, and after ``DROP_GRACE_NS`` its
    worker is killed, an expected exit that counts as no crash."""
    from daisy_nb.runtime.local.backups import DROP_GRACE_NS

    m, orig, copy, row = backed_up_straggler()
    m.read_limit(copy)
    m.act(copy)
    finish_block(m, copy)
    m.read_limit(copy)
    m.act(copy)  # the copy won: the straggler's block is dropped
    assert m.w[orig].drop is not None
    sent = 0
    while not m.w[orig].killed:
        assert m.w[orig].drop is not None, "a drop under way was not sent again"
        m.w[orig].drop = None  # the signal is lost on the way
        sent += 1
        m.look(0.1)
        assert sent * 0.1 <= DROP_GRACE_NS / 1e9 + 0.2, "the worker was not killed after the grace"
    assert sent >= int(DROP_GRACE_NS / 1e9 / 0.1) - 1
    m.reap(orig)  # no crash (checked in reap)
    m.teardown()
    assert counts(m) == (12, 0, 0, 0)


def test_a_backup_that_fails_while_the_straggler_runs_is_dropped():
    m, orig, copy, row = backed_up_straggler()
    before = counts(m)
    m.read_limit(copy)
    m.act(copy)
    m.w[copy].slots[m.w[copy].order[0]].status[0] = FAILED
    m.w[copy].between = True
    m.read_limit(copy)
    m.act(copy)  # the copy's failure: the straggler decides
    assert counts(m) == before
    finish_block(m, orig)
    m.read_limit(orig)
    m.act(orig)
    done, failed, busy, ready = before
    assert counts(m) == (done + 1, failed, busy - 1, ready)
    assert not any(w.killed for w in m.w.values())
    m.teardown()
    assert counts(m) == (12, 0, 0, 0)


@given(steps=st.lists(st.sampled_from(["copy", "orig", "land", "lose", "look", "long look"]), min_size=1, max_size=30))
@settings(max_examples=200, deadline=None)
def test_a_race_of_copies_ends_with_one_end_counted_whatever_the_drop_meets(steps):
    """A straggler and its backup race; the loser's drop lands, is lost, or comes too late, in
    any order with the copies' own steps and the pool's looks (``long look``: past the grace).
    The block counts once, a dropped worker runs on, a killed one's exit is no crash, and the
    core's invariants hold at every step."""
    m, orig, copy, row = backed_up_straggler()
    for step in steps:
        if step in ("copy", "orig"):
            wid = copy if step == "copy" else orig
            if wid in m.w and not m.w[wid].killed and m.w[wid].order:
                step_unless_straggling(m, wid, False)
        elif step in ("land", "lose"):
            for wid in (orig, copy):
                if wid in m.w and m.w[wid].drop is not None:
                    if step == "land":
                        m.land_drop(wid)
                    else:
                        m.w[wid].drop = None  # lost on the way (or came while the worker's own code ran)
        else:
            m.look(0.01 if step == "look" else 1.5)
        for wid in [wid for wid, w in sorted(m.w.items()) if w.killed]:
            m.reap(wid)  # no crash (checked in reap)
        m.valid()
    m.teardown()
    assert counts(m) == (12, 0, 0, 0)
    assert m.ran[row] <= 2


def test_pool_backup_copy_of_a_hanging_block_wins_and_the_straggler_is_no_crash(out, no_leaks):
    """Real worker processes, ``speculative=True``: a block's first attempt hangs; its backup copy
    runs on the worker that finished the rest, wins, and the hanging copy's worker is killed
    without counting as a crash or a restart. Every block counts once and ran to its end once."""
    import givebackfns as g

    task = daisy_nb.Task(
        "s", Roi((0,), (10 * g.N,)), Roi((0,), (10,)), Roi((0,), (10,)),
        process_function=g.first_attempt_hangs, max_workers=2, max_retries=0, speculative=True,
        tracking_path=False,
    )  # fmt: skip
    states = daisy_nb.run_blockwise(task, progress=False, summary=False, return_states=True)
    s = states["s"]
    assert (s.completed_count, s.failed_count, s.orphaned_count) == (g.N, 0, 0)
    assert (s.worker_failure_count, s.worker_restart_count) == (0, 0)
    done = sorted(int(f.split(".")[0]) for f in os.listdir(out / "done"))
    assert done == list(range(g.N)), "a block ran to its end twice, or never"
    assert (out / "slow_started").exists()


def test_pool_a_losing_copy_is_dropped_and_its_worker_keeps_what_init_fn_loaded(out, no_leaks):
    """Real worker processes, ``speculative=True`` and an ``init_fn``: the hanging first attempt
    loses to its backup and is interrupted by a signal, not killed. Its worker runs on: the task
    ran in its two workers only, each ran ``init_fn`` once, and blocks ran in both after the
    drop; every block counts once and ran to its end once."""
    import givebackfns as g

    task = daisy_nb.Task(
        "s", Roi((0,), (10 * g.N,)), Roi((0,), (10,)), Roi((0,), (10,)),
        process_function=g.first_attempt_hangs, init_fn=g.init_once, max_workers=2, max_retries=0,
        speculative=True, tracking_path=False,
    )  # fmt: skip
    states = daisy_nb.run_blockwise(task, progress=False, summary=False, return_states=True)
    s = states["s"]
    assert (s.completed_count, s.failed_count, s.orphaned_count) == (g.N, 0, 0)
    assert (s.worker_failure_count, s.worker_restart_count) == (0, 0)
    done = [f.split(".") for f in os.listdir(out / "done")]
    assert sorted(int(b) for b, _, _ in done) == list(range(g.N)), "a block ran to its end twice, or never"
    inits = {int(p) for p in os.listdir(out / "init")}
    assert len(inits) == 2, f"init_fn ran in {len(inits)} processes: a losing copy's worker was replaced"
    assert {int(pid) for _, pid, _ in done} == inits
    assert (out / "slow_started").exists()


def test_pool_at_the_tail_a_copy_comes_after_a_few_medians_not_k(out, no_leaks):
    """Real worker processes, ``speculative=40``: the last block's first attempt sleeps a minute
    (a slow node), at the task's tail. Its copy starts once it has run past 1.5 median block
    times (allowing for a busy machine: well under 10), not 40, and wins; the slow attempt is
    interrupted. Every block counts once and ran to its end once."""
    import givebackfns as g

    task = daisy_nb.Task(
        "s", Roi((0,), (g.TAIL_N,)), Roi((0,), (1,)), Roi((0,), (1,)),
        process_function=g.last_first_attempt_sleeps, max_workers=2, max_retries=0, speculative=40,
        tracking_path=False,
    )  # fmt: skip
    states = daisy_nb.run_blockwise(task, progress=False, summary=False, return_states=True)
    s = states["s"]
    assert (s.completed_count, s.failed_count, s.orphaned_count) == (g.TAIL_N, 0, 0)
    assert (s.worker_failure_count, s.worker_restart_count) == (0, 0)
    done = sorted(int(f.split(".")[0]) for f in os.listdir(out / "done"))
    assert done == list(range(g.TAIL_N)), "a block ran to its end twice, or never"
    first, copy = (float((out / f"start_{g.TAIL_N - 1}_{k}").read_text()) for k in ("first", "copy"))
    assert copy - first < 10 * g.TAIL_WORK_SECS, f"the copy came {copy - first:.2f} s after the straggler"


def test_pool_a_losing_copy_that_cannot_be_interrupted_has_its_worker_killed(out, no_leaks):
    """Real worker processes: the hanging first attempt blocks the drop signal (C code that does
    not return to Python): a second after its backup won, its worker is killed, with no crash or
    restart counted, and the run ends long before the hang's own deadline."""
    import time

    import givebackfns as g

    task = daisy_nb.Task(
        "s", Roi((0,), (10 * g.N,)), Roi((0,), (10,)), Roi((0,), (10,)),
        process_function=g.first_attempt_hangs_unstoppable, max_workers=2, max_retries=0,
        speculative=True, tracking_path=False,
    )  # fmt: skip
    t0 = time.monotonic()
    states = daisy_nb.run_blockwise(task, progress=False, summary=False, return_states=True)
    s = states["s"]
    assert (s.completed_count, s.failed_count, s.orphaned_count) == (g.N, 0, 0)
    assert (s.worker_failure_count, s.worker_restart_count) == (0, 0)
    assert time.monotonic() - t0 < g.DEADLINE_SECS / 2, "the uninterruptible copy was waited out"
    done = sorted(int(f.split(".")[0]) for f in os.listdir(out / "done"))
    assert done == list(range(g.N)), "a block ran to its end twice, or never"


def straggler_alone_at_the_tail() -> tuple[GiveBackMachine, int]:
    """A speculative task (factor 2) on three workers whose every block but one finished: the
    machine and the straggler's worker (no look has run: no backup yet)."""
    m = GiveBackMachine()
    m.in_hypothesis = False
    m.start(n=12, workers=3, speculative=2.0)
    m.spawns = False
    slow = None
    for _ in range(1000):
        for wid in list(m.busy()):
            w = m.w[wid]
            if slow is None and w.cur == 0 and w.running() and m.s.ready_count("a") == 0:
                slow = wid  # the first block of its batch: alone in flight once the others ended
            step_unless_straggling(m, wid, wid == slow)
        if slow is not None and m.s.counts("a").processing == 1 and not [x for x in m.busy() if x != slow]:
            return m, slow
    raise AssertionError("the straggler was never alone")


def test_a_speculative_task_keeps_one_parked_worker_per_block_in_flight_at_its_tail():
    """At the tail (one straggler in flight) the parked workers trying again keep exactly one
    of them for its backup, however often they try; the others quit."""
    m, slow = straggler_alone_at_the_tail()
    assert m.core.inflight("a") == 1
    for _ in range(3):
        m.apply(m.core.dispatch_parked())
        assert len(m.core.parked_of("a")) == 1
        m.valid()
    # meanwhile the pool looks for the straggler's copy every CHECK_SECS, not every POLL_SECS
    procs = SimpleNamespace(blocks=SimpleNamespace(core=m.core))
    assert m.core.backups.copies_due() and pool._wait_limit(False, None, procs) == pool.CHECK_SECS
    finish_block(m, slow)
    m.read_limit(slow)
    m.act(slow)
    assert m.core.inflight("a") == 0 and not m.core.backups.copies_due()
    assert pool._wait_limit(False, None, procs) == pool.POLL_SECS


def test_at_the_tail_the_straggler_gets_its_backup_after_one_and_a_half_medians():
    """At the tail (nothing ready or waiting, one straggler in flight, a worker parked for it),
    the backup goes out once the straggler has run past 1.5 median block times, not ``k`` (2
    here): the parked worker would idle anyway. Blocks of 10 ms, in batches of several, so the
    straggler's batch companions are given back first, at 1.5 typical block times too (in the
    bulk: ``min(4, k)``, and at least a batch's target time)."""
    m = GiveBackMachine()
    m.in_hypothesis = False
    m.start(n=40, workers=3, speculative=2.0)
    m.spawns = False
    slow = row = None
    for _ in range(1000):
        m.now += 10_000_000  # every block takes 10 ms
        for wid in list(m.busy()):
            w = m.w[wid]
            if slow is None and w.cur >= 0 and w.running() and m.s.ready_count("a") == 0:
                slow, row = wid, int(w.slots[w.order[0]].rows[w.cur])
                t0 = w.start_ns
            step_unless_straggling(m, wid, wid == slow)
        m.apply(m.core.dispatch_parked())
        if slow is not None and not [x for x in m.busy() if x != slow]:
            break
    else:
        raise AssertionError("the straggler was never alone")
    spec = m.core.backups.spec
    assert spec.settled(0) and abs(spec.median(0) - 0.01) < 1e-9 and m.core.parked_of("a")
    m.now = t0 + 14_000_000
    for _ in range(3):  # at 1.4 medians: no cut, no copy
        m.look(0.0)
        assert ("a", row) not in m.core.backups.twins and not m.core.workers[slow].cuts
    for secs in (0.0015, 0.0025, 0.001):  # past 1.5 medians: the cut (if it holds more), confirmed, the copy
        m.look(secs)
    assert m.now - t0 < 20_000_000, "below k = 2 medians"
    pair = m.core.backups.twins.get(("a", row))
    assert pair is not None and slow in pair and len(pair) == 2, "no copy at the tail after 1.5 medians"
    m.valid()


def backup_in_the_bulk(n: int = 200) -> tuple[GiveBackMachine, int, int, int]:
    """A speculative task (factor 2) past its median's window (64 blocks) with blocks still
    ready: worker 0's block straggles while worker 1 runs batch after batch. Returns the
    machine, the straggler's worker, the worker that took its backup, and its row."""
    m = GiveBackMachine()
    m.in_hypothesis = False
    m.start(n=n, workers=2, speculative=2.0)
    m.spawns = False
    slow = None
    for _ in range(5000):
        for wid in list(m.busy()):
            w = m.w[wid]
            warm = m.core.backups.spec.settled(0)
            if slow is None and wid == 0 and warm and w.cur >= 0 and w.running():
                slow = int(w.slots[w.order[0]].rows[w.cur])
            step_unless_straggling(m, wid, slow is not None and wid == 0)
        m.look(0.01)
        pair = m.core.backups.twins.get(("a", slow)) if slow is not None else None
        if pair:
            (copy_wid,) = pair - {0}
            return m, 0, copy_wid, slow
    raise AssertionError("no backup was launched")


def test_a_due_backup_takes_the_next_free_worker_before_fresh_blocks():
    """In the bulk of a task no worker is parked: the straggler's backup is due, no batch is sent
    ahead meanwhile, and the next worker with nothing to run takes the backup, not fresh blocks."""
    m, orig, copy, row = backup_in_the_bulk()
    assert copy == 1 and m.s.ready_count("a") > 0, "the backup did not come before the ready blocks"
    assert [list(rows) for _, rows in m.core.workers[copy].queue] == [[row]], "a fresh batch beside the backup"
    assert m.core.workers[orig].queue[0][1][-1] == row and m.w[orig].running()
    for _ in range(3):  # the backup runs, wins, and the straggler's block is dropped
        step_unless_straggling(m, copy, False)
    assert m.w[orig].drop is not None and not m.w[orig].killed and not m.w[copy].killed
    m.land_drop(orig)
    m.teardown()
    assert counts(m) == (200, 0, 0, 0)
    assert m.ran[row] == 2 and sum(m.ran.values()) == 201  # only the straggler ran twice


def test_a_backup_that_is_slow_itself_is_stopped_and_the_straggler_runs_on():
    """The block is slow, not its first attempt: its backup, once it has run 2k x the median
    block time itself, is killed (no crash), and the straggler's end counts, once."""
    m, orig, copy, row = backup_in_the_bulk()
    m.read_limit(copy)
    m.act(copy)  # the backup starts the block
    done, failed, busy, ready = counts(m)
    for _ in range(100):
        if m.w[copy].drop is not None:
            break
        m.look(0.01)
        for wid in list(m.busy()):
            step_unless_straggling(m, wid, wid in (orig, copy))
    assert m.w[copy].drop is not None and not m.w[orig].killed and m.w[orig].running()
    assert ("a", row) not in m.core.backups.twins
    m.land_drop(copy)  # the backup stops; its worker runs on
    step_unless_straggling(m, copy, False)
    assert m.w[copy].dropped == 1 and copy in m.core.workers
    finish_block(m, orig)
    m.read_limit(orig)
    m.act(orig)
    assert m.s.counts("a").completed >= done + 1 and m.s.counts("a").failed == failed
    m.teardown()
    assert counts(m) == (200, 0, 0, 0)
    assert m.ran[row] == 2


def test_at_the_tail_a_worker_kept_for_a_block_that_had_its_backup_quits():
    """Three workers, one straggler at the tail: two are parked for it until its backup goes to
    one of them; the other then quits (a parked worker holds its share of ``resources``)."""
    m, _ = straggler_alone_at_the_tail()
    m.apply(m.core.dispatch_parked())
    assert len(m.core.parked_of("a")) == 1  # one block in flight: one kept
    m.look(10.0)  # the straggler's backup goes to the parked worker
    assert len(m.busy()) == 2 and m.core.parked_of("a") == []
    m.spawn()  # a worker that asks now is not kept: the one block in flight had its copy
    m.apply(m.core.dispatch_parked())
    assert m.core.parked_of("a") == [] and m.core.backups.may_get_copy("a") == 0 and m.core.inflight("a") == 2
    m.valid()


def test_the_backup_rule_measures_blocks_not_the_batches_they_ran_in():
    """A speculative task's blocks run in batches of several, 10 ms each, and a look sees every
    one of them running: the median the backup rule multiplies is 10 ms, not the time from a
    block's start to its batch's "done" (about 20 ms on batches of 3: backups 1.5 times late)."""
    s = scheduler(90, speculative=3.0)
    core = BlockCore(s, target_secs=0.03, capacity=16)
    core.add_task("a")
    core.add(0, "a")
    core.ready(0)
    now, sizes = 10**12, []
    while core.workers[0].queue:
        rows = core.workers[0].queue[0][1]
        sizes.append(len(rows))
        for i in range(len(rows)):  # each block runs 10 ms; a look 5 ms into it sees it
            core.straggling(now + 5_000_000, {0: Running(i, now, int(BlockStatus.PROCESSING))})
            now += 10_000_000
        now += 1_000_000  # the "done" reaches the pool 1 ms after the batch ended
        st_ = np.full(len(rows), int(BlockStatus.SUCCESS), dtype=np.uint8)
        core.batch_done(0, st_, 10_000_000 * len(rows), now_ns=now)
    assert s.is_done() and max(sizes) >= 3, f"batch sizes {sizes}"
    median = core.backups.spec.tasks[0].median()
    assert median is not None and 0.0099 < median < 0.0115, f"median block time {median}"


def test_the_backup_rule_takes_each_blocks_own_time_from_its_worker():
    """A speculative task's workers write each block's own run time (``_shm``'s ``secs``), and the
    rule's window holds those, not the batch's time per block, which narrows the spread it sees
    (blocks of 2, 4, 8 and 30 ms in batches of several: every one 11 ms on average)."""
    s = scheduler(80, speculative=3.0)
    core = BlockCore(s, target_secs=0.03, capacity=16)
    core.add_task("a")
    core.add(0, "a")
    core.ready(0)
    now, own, sizes = 10**12, [2_000_000, 4_000_000, 8_000_000, 30_000_000], []
    while core.workers[0].queue:
        rows = core.workers[0].queue[0][1]
        sizes.append(len(rows))
        secs = np.array([own[int(r) % 4] for r in rows], dtype=np.int64)
        now += int(secs.sum()) + 1_000_000
        st_ = np.full(len(rows), int(BlockStatus.SUCCESS), dtype=np.uint8)
        core.batch_done(0, st_, int(secs.sum()), now_ns=now, secs=secs)
    assert s.is_done() and max(sizes) >= 3, f"batch sizes {sizes}"
    window = sorted(core.backups.spec.tasks[0]._secs)
    assert set(window) == {0.002, 0.004, 0.008, 0.03}, f"block times {window[:8]}..."
    assert core.backups.spec.tasks[0].median() == pytest.approx(0.006)


def test_pool_speculative_workers_report_each_blocks_own_time(out, no_leaks, monkeypatch):
    """Real worker processes: the time each block of a speculative task took, as its worker
    measured it, reaches the backup rule with its batch's end (blocks of one batch take 2 to
    30 ms: none is taken at the batch's average)."""
    import givebackfns as g

    from daisy_nb.runtime.local.backups import PoolBackups

    seen: dict[int, list[float]] = {}
    ended = PoolBackups.ended

    def spy(self, w, rows, st, now_ns, per_block, secs=None):
        if secs is not None:
            for row, x, k in zip(rows.tolist(), secs.tolist(), st.tolist(), strict=True):
                if k == int(BlockStatus.SUCCESS):
                    seen.setdefault(int(row), []).append(x / 1e9)
        return ended(self, w, rows, st, now_ns, per_block, secs)

    monkeypatch.setattr(PoolBackups, "ended", spy)
    task = daisy_nb.Task(
        "s", Roi((0,), (120,)), Roi((0,), (1,)), Roi((0,), (1,)),
        process_function=g.sleeps_by_id, max_workers=2, max_retries=0, speculative=True, tracking_path=False,
    )  # fmt: skip
    states = daisy_nb.run_blockwise(task, progress=False, summary=False, return_states=True)
    assert states["s"].completed_count == 120
    assert len(seen) >= 100, f"{len(seen)} blocks' own times reached the rule"
    for row, xs in seen.items():
        want = g.SPREAD_SECS[row % 4]  # the task's rows are its blocks' ids here (one block per unit)
        assert all(want <= x < want + 0.5 for x in xs), f"block {row}: {xs}, it sleeps {want}"
    assert {g.SPREAD_SECS[r % 4] for r in seen} == set(g.SPREAD_SECS)


def test_the_look_that_confirms_a_cut_is_due_a_confirmation_time_after_it(monkeypatch):
    """The pool does not wait a whole scan (``CHECK_SECS``) to give a straggler's blocks back: the
    look after a cut is due ``CONFIRM_NS`` after it, and the pool's wait ends then; once the
    cut is settled, no early look is asked for."""
    m, wid = straggling_worker()
    procs = SimpleNamespace(blocks=SimpleNamespace(core=m.core))
    # the pool's clock is the machine's: here it reads the machine's fake one (which starts at
    # 1,000 s, before or after the real clock by how long the machine has been up)
    monkeypatch.setattr(pool, "time", SimpleNamespace(monotonic=lambda: m.now / 1e9))
    m.read(1.0)
    m.decide()  # cut
    assert m.core.look_again_ns == m.now + CONFIRM_NS
    assert pool._wait_limit(False, None, procs) == pytest.approx(CONFIRM_NS / 1e9)
    m.read(CONFIRM_NS / 1e9)
    m.decide()  # confirmed
    assert m.core_rows(wid, m.w[wid].order[0]) == 1 and m.core.look_again_ns is None
    assert pool._wait_limit(False, None, procs) == pool.POLL_SECS
    m.teardown()


def test_at_the_tail_the_look_for_a_backup_comes_when_its_block_reaches_the_limit():
    """A speculative task (factor 2) at its tail, a worker parked for a copy of the one block still
    running: the pool does not wait for its next scan (``CHECK_SECS``) to copy it. A look asks for
    the next one just after the block reaches 1.5 median block times (``look_again_ns``, which
    ends the pool's wait), and that look sends the copy; a look before it sends none."""
    s = scheduler(20, speculative=2.0)
    core = BlockCore(s, target_secs=0.03, capacity=16)
    core.add_task("a")
    core.add(0, "a")
    core.ready(0)
    now, running = 10**12, None
    while running is None:  # worker 0 runs every block, 10 ms each, up to the task's last one
        rows = core.workers[0].queue[0][1]
        for i in range(len(rows)):
            if s.ready_count("a") == 0 and i == len(rows) - 1 and len(core.workers[0].queue) == 1:
                running = {0: Running(i, now, int(BlockStatus.PROCESSING))}  # the last block: it runs on
                break
            core.straggling(now + 5_000_000, {0: Running(i, now, int(BlockStatus.PROCESSING))})
            now += 10_000_000
        else:
            now += 1_000_000
            st_ = np.full(len(rows), int(BlockStatus.SUCCESS), dtype=np.uint8)
            core.batch_done(0, st_, 10_000_000 * len(rows), now_ns=now)
    start = running[0].start_ns
    core.add(1, "a")
    assert core.ready(1) == [] and core.parked_of("a") == [1], "the new worker waits parked for the copy"
    median = core.backups.spec.median(0)
    due = start + round(1.5 * median * 1e9)
    assert core.straggling(start + 5_000_000, running) == []
    assert core.look_again_ns is not None and abs(core.look_again_ns - due) < 10_000
    assert core.straggling(due - 1_000_000, running) == [], "a copy before its block reached the limit"
    sent = core.straggling(core.look_again_ns, running)
    assert [type(a) for a in sent] == [SendBatch] and sent[0].wid == 1
