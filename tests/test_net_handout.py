"""The TCP hand-out core (``daisy_nb.runtime.net.handout``) without sockets or processes.

A hypothesis ``RuleBasedStateMachine`` drives :class:`HandOut` against the real
``daisy_nb.Scheduler`` with random event sequences: connections opening, saying hello
(or not, or twice), asking, releasing, failing, giving back, saying goodbye, frames of
several connections in one pass and in any order (releases of blocks never held,
duplicates), connections dying at any point (lost, a broken frame, a send that fails),
the clock moving (heartbeats, silent peers, block timeouts), abandonment and Ctrl-C.
Every frame crosses the real encoder and decoder (:mod:`daisy_nb.runtime.net.wire`).
After every step: ``HandOut.validate()`` (every block handed out held by exactly one
connection; held equals the scheduler's processing count; parked connections hold
nothing), plus what the clients saw: nothing is sent after a close, no block is held by
two clients, a block sent is one the scheduler handed out.

A second machine (``TailMachine``) plays well-behaved clients whose jobs die, so that runs
reach a task's tail: once the parked clients were served, at most one client per task is
kept there and only while a block in flight could still need a retry
(``net/tail.check_tail``), no client stays parked while blocks are ready, and ready blocks
no parked client takes make the spawn plan start a worker function.

A third (``WalltimeMachine``) gives some clients a known end (the seconds left in their
hello) on a fake clock: a block goes to one only while its time left covers twice the
median of the task's finished blocks (three times for a block sent ahead), measured here
from the clients' own view of when each block started and ended; a parked one whose time
ran short is told to end; every client told to end is a clean end for its worker function.

Also the decisions the end-to-end tests used to observe by wrapping private methods
(``Clients._on_client_msg``, ``_send_block``): a release is a request, a failure is not,
blocks go ahead after the first, a request crossing a block on its way is answered by
it, quiet time only when everybody holds two blocks.
"""

from __future__ import annotations

import functools
import statistics
from collections import deque

import pytest
from funlib.geometry import Roi
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import daisy_nb
from daisy_nb.runtime.local.budget import Budget, TaskNeed, plan_spawns
from daisy_nb.runtime.net import wire
from daisy_nb.runtime.net.handout import QUIET_MAX_SECS, WALLTIME_FACTOR, Close, HandOut, Send, check_walltime
from daisy_nb.runtime.net.tail import at_tail, check_tail, running_secs
from daisy_nb.scheduler import Scheduler

MS = 1_000_000  # ns


def _noop(*a, **k):
    return None


class TaskRun:
    """The fields of a task's run record the core reads and writes."""

    def __init__(self, tid: str, timeout_ns: int | None = None):
        self.tid = tid
        self.timeout_ns = timeout_ns
        self.res = None
        self.block_secs: deque = deque(maxlen=64)
        self.t_first = None


class FakeJobs:
    """The pool's worker-function part, as the core sees it: answers, and a log of what it was told."""

    def __init__(self, timed_out_keeps: bool = False):
        self.timed_out_keeps = timed_out_keeps
        self.results: list[tuple] = []
        self.lost: list[int] = []
        self.released: list[int] = []  # told that no block is left
        self.ready: list[int] = []  # first asks for a block
        self.acquired = 0

    def is_worker(self, wid):
        return True

    def job_connected(self, wid, tr):
        return wid >= 0

    def job_ready(self, wid, tr):
        self.ready.append(wid)

    def job_acquired(self, wid):
        self.acquired += 1

    def job_released(self, wid):
        self.released.append(wid)

    def job_result(self, wid, tr, *, raised, finished):
        self.results.append((wid, tr.tid, raised, finished))

    def job_log(self, wid):
        return None

    job_label = job_pid = job_log

    def job_lost(self, wid, tr):
        self.lost.append(wid)

    def job_timed_out(self, wid, tr):
        return self.timed_out_keeps

    def died_with_template(self, wid):
        return False

    def has_workers(self, tr):
        return True

    start_secs = None  # how long a job takes to start (None: not measured yet)

    def job_start_secs(self, tid):
        return self.start_secs


def make_tasks(n_a: int, n_b: int, retries: int, speculative=None, conflict: bool = False):
    """``a`` (n_a blocks) and ``b`` downstream of it (its blocks wait: parking); ``speculative``:
    both tasks' ``Task(speculative=...)``; ``conflict``: ``b`` reads its neighbours' writes
    (``read_write_conflict``: its blocks also wait on its own blocks of the level before)."""
    a = daisy_nb.Task(
        "a", Roi((0,), (10 * n_a,)), Roi((0,), (10,)), Roi((0,), (10,)), process_function=_noop,
        read_write_conflict=False, max_retries=retries, tracking_path=False, speculative=speculative,
    )  # fmt: skip
    if conflict:  # b's blocks write [10 i + 10, 10 i + 20) and read 10 more on each side
        rois = Roi((0,), (10 * n_b + 20,)), Roi((0,), (30,)), Roi((10,), (10,))
    else:
        rois = Roi((0,), (10 * n_b,)), Roi((0,), (10,)), Roi((0,), (10,))
    b = daisy_nb.Task(
        "b", *rois, process_function=_noop, read_write_conflict=conflict, max_retries=retries,
        tracking_path=False, speculative=speculative,
    )  # fmt: skip
    return a + b


NET = {"heartbeat": 1.0, "peer_timeout": 5.0, "auth": 1.0}


class Harness:
    """A core, its scheduler, and the clients' view of what was sent (the shell's part, without sockets)."""

    def __init__(
        self,
        n_a=6,
        n_b=4,
        retries=1,
        timeout_ns=None,
        timed_out_keeps=False,
        fail_sends=(),
        speculative=None,
        conflict=False,
    ):
        self.s = Scheduler(make_tasks(n_a, n_b, retries, speculative, conflict))
        self.trs = {"a": TaskRun("a", timeout_ns), "b": TaskRun("b")}
        self.jobs = FakeJobs(timed_out_keeps)
        self.core = HandOut(self.s, self.trs, self.jobs, self.abandon, net=NET, connected_too_late=self.too_late)
        self.now = 10**12
        self.inbox: dict[int, list] = {}  # connection -> blocks and NO_MOREs received, in order
        self.closed: set[int] = set()
        self.fail_sends = set(fail_sends)  # connections whose sends fail (a peer that stopped reading)
        self.returned: set[int] = set()  # worker ids whose worker function returned (too-late hellos)
        self.abandoned: list[str] = []

    def running(self):
        """Task id -> how long each of its blocks in flight has run now (``net/tail.running_secs``)."""
        return functools.partial(running_secs, self.core.conns.values(), self.s, now_ns=self.now)

    def too_late(self, cc):
        return "connected too late" if cc.wid in self.returned else None

    def abandon(self, tid, reason):
        for t in self.s.abandon_task(tid, reason):
            self.abandoned.append(t)
            self.core.drop_task(t)

    def run(self) -> list:
        """Execute the core's actions as the shell does; returns them."""
        done = []
        while acts := self.core.take():
            for a in acts:
                done.append(a)
                if isinstance(a, Close):
                    assert a.cid not in self.closed, f"closed {a.cid} twice"
                    self.closed.add(a.cid)
                    continue
                assert isinstance(a, Send)
                assert a.cid not in self.closed, f"sent to {a.cid} after closing it"
                if a.cid in self.fail_sends:
                    self.core.lost(a.cid)
                    continue
                self.inbox.setdefault(a.cid, []).append(wire.decode_server(a.payload))
        return done

    def open(self, cid: int) -> None:
        self.core.opened(cid, ("127.0.0.1", 40000 + cid), self.now)

    def frames(self, *pairs) -> list:
        """One pass: ``(cid, [payload, ...])`` pairs, decoded as the shell does."""
        self.core.on_frames([(cid, [wire.decode_client(p) for p in ps]) for cid, ps in pairs], self.now)
        out = self.run()
        self.core.validate()
        if self.core.quiet_secs > 0:  # no client may run dry while the frames wait unread
            assert not self.core.parked
            assert all(len(cc.held) == 2 for cc in self.core.conns.values() if cc.tr is not None), "quiet, one holds <2"
        return out

    def blocks(self, cid: int) -> list[int]:
        return [m.block for m in self.inbox.get(cid, []) if isinstance(m, wire.BlockRow)]


HELLO_A = wire.encode_hello("a", 0)
REQ = wire.encode_acquire()


def rel(i, status=2):
    return wire.encode_release(i, status)


# ------------------------------------------------------------------ decisions, one by one
def test_a_release_is_a_request_and_a_failure_is_not():
    h = Harness(n_a=6, n_b=1)
    h.open(1)
    h.frames((1, [HELLO_A, REQ]))
    (first,) = h.blocks(1)
    h.frames((1, [rel(first)]))  # done, and the next one: answered without an ACQUIRE
    assert len(h.blocks(1)) >= 2
    second = h.blocks(1)[1]
    n = len(h.blocks(1))
    tb = 'Traceback (most recent call last):\n  File "x.py", line 1, in f\nBoom: disk 3 is gone'
    h.frames((1, [wire.encode_failure(second, 7, "Boom", "disk 3 is gone", tb)]))  # a failure asks for nothing
    held = set(h.core.conns[1].held)
    assert second not in held and len(h.blocks(1)) == n
    c = h.s.counters["a"]
    assert c.last_worker_error == f"block ('a', 7) failed:\n{tb}"  # the text the client used to send
    # grouped by the fields as sent (the text path would not take "Boom" for an exception's name)
    (g,) = c.error_groups.as_list()
    assert (g["type"], g["message"], g["first_block"], g["count"]) == ("Boom", "disk 3 is gone", 7, 1)
    assert h.jobs.results[-1] == (0, "a", True, False)


def test_blocks_go_ahead_after_the_first_and_a_crossing_request_is_answered_by_it():
    h = Harness(n_a=20, n_b=1)
    h.open(1)
    h.frames((1, [HELLO_A, REQ]))
    assert len(h.blocks(1)) == 1  # the first block: nothing ahead (no block time known)
    h.frames((1, [rel(h.blocks(1)[0])]))
    got = h.blocks(1)
    assert len(got) == 3 and len(h.core.conns[1].held) == 2  # the next one, and one ahead
    # the release of the second crosses the block sent ahead: that block answers it, one more goes ahead
    h.frames((1, [rel(got[1])]))
    assert len(h.blocks(1)) == 4 and list(h.core.conns[1].held) == [got[2], h.blocks(1)[3]]


def test_no_block_goes_ahead_when_the_ready_blocks_do_not_cover_two_per_client():
    h = Harness(n_a=4, n_b=1)
    for c in (1, 2):
        h.open(c)
        h.frames((c, [wire.encode_hello("a", c), REQ]))
    h.frames((1, [rel(h.blocks(1)[0])]))  # 2 clients, 2 ready blocks left: none ahead
    assert len(h.core.conns[1].held) == 1


def test_a_client_that_waits_is_parked_then_served_and_told_when_nothing_is_left():
    h = Harness(n_a=1, n_b=1)
    h.open(1)
    h.open(2)
    h.frames((1, [HELLO_A, REQ]), (2, [wire.encode_hello("b", 1), REQ]))
    assert h.core.conns[2].parked and h.blocks(2) == []  # b's block waits for a's
    (a0,) = h.blocks(1)
    h.frames((1, [rel(a0)]))  # a is done: 1 gets NO_MORE
    assert h.inbox[1][-1] is wire.NO_MORE
    h.core.serve_parked(h.now)
    h.run()
    h.core.validate()
    assert len(h.blocks(2)) == 1 and not h.core.conns[2].parked


def test_give_back_and_goodbye_are_uncounted_and_a_drop_fails_the_running_block_only():
    h = Harness(n_a=20, n_b=1, retries=0)
    h.open(1)
    h.frames((1, [HELLO_A, REQ]))
    h.frames((1, [rel(h.blocks(1)[0])]))
    running, ahead = list(h.core.conns[1].held)
    h.frames((1, [wire.encode_give_back(ahead)]))  # back to the queue, uncounted
    assert list(h.core.conns[1].held) == [running]
    h.core.lost(1)  # the connection drops while its block runs
    h.run()
    h.core.validate()
    assert 1 in h.closed
    st_ = h.s.task_states["a"]
    assert st_.failed_count == 1 and st_.completed_count == 1  # the running block failed, the given back did not


def test_quiet_time_only_when_everybody_that_asked_holds_two():
    h = Harness(n_a=40, n_b=1)
    h.open(1)
    h.frames((1, [HELLO_A, REQ]))
    assert h.core.quiet_secs == 0  # holds one block
    h.now += 8 * MS
    h.frames((1, [rel(h.blocks(1)[0])]))
    assert len(h.core.conns[1].held) == 2
    assert 0 < h.core.quiet_secs <= QUIET_MAX_SECS
    assert h.core.quiet_secs == pytest.approx(0.25 * 0.008)


def test_no_quiet_time_while_a_client_that_did_not_ask_holds_one_block():
    """Quiet time delays every frame, so also the release of a client with nothing behind its
    block: it would wait out the quiet time idle. Here client 2 of ``a`` holds one block when
    client 1's release gives 1 two; then ``b``'s only client holds one (``b`` is fed one block
    by each of ``a``'s, as a downstream task paced by its upstream) while ``a``'s hold two."""
    h = Harness(n_a=40, n_b=4)
    for c in (1, 2):
        h.open(c)
        h.frames((c, [wire.encode_hello("a", c), REQ]))
    h.now += 8 * MS
    h.frames((1, [rel(h.blocks(1)[0])]))
    assert len(h.core.conns[1].held) == 2 and len(h.core.conns[2].held) == 1
    assert h.core.quiet_secs == 0
    h.frames((2, [rel(h.blocks(2)[0])]))  # now both hold two
    assert h.core.quiet_secs == pytest.approx(0.25 * 0.008)
    h.open(3)
    h.frames((3, [wire.encode_hello("b", 3), REQ]))  # b's block 0 is ready (a's block 0 is done)
    assert len(h.core.conns[3].held) == 1 and not h.core.parked
    h.now += 8 * MS
    got = h.blocks(1)
    h.frames((1, [rel(got[1])]))  # a's client 1 holds two again; b's client still one
    assert len(h.core.conns[1].held) == 2
    assert h.core.quiet_secs == 0


def test_stop_hands_out_nothing_more_but_takes_releases():
    h = Harness(n_a=20, n_b=1)
    h.open(1)
    h.frames((1, [HELLO_A, REQ]))
    h.frames((1, [rel(h.blocks(1)[0])]))
    sent = len(h.blocks(1))
    h.core.stop()
    held = list(h.core.conns[1].held)
    h.frames((1, [rel(held[0]), rel(held[1])]))
    assert len(h.blocks(1)) == sent and not h.core.conns[1].held
    assert h.s.task_states["a"].completed_count == 3 and h.core.quiet_secs == 0


def test_silent_peers_are_dropped_and_live_ones_pinged():
    h = Harness()
    h.open(1)
    h.open(2)
    h.frames((1, [HELLO_A, REQ]), (2, [wire.encode_hello("a", 2)]))
    h.now += int(2e9)
    h.frames((2, [wire.encode_ping()]))
    h.core.heartbeats(h.now)
    acts = h.run()
    assert Send(1, wire.encode_ping()) in acts and 2 not in h.closed
    h.now += int(4e9)  # 1 silent for 6 s > peer_timeout
    h.core.heartbeats(h.now)
    h.run()
    h.core.validate()
    assert 1 in h.closed and h.jobs.lost == [0] and 2 not in h.closed


def test_a_block_past_its_timeout_fails_and_the_one_behind_goes_back():
    h = Harness(n_a=20, n_b=1, retries=2, timeout_ns=50 * MS, timed_out_keeps=True)
    h.open(1)
    h.frames((1, [HELLO_A, REQ]))
    h.frames((1, [rel(h.blocks(1)[0])]))
    assert len(h.core.conns[1].held) == 2
    h.now += 60 * MS
    h.core.check_timeouts(h.now)
    h.run()
    h.core.validate()
    assert not h.core.conns[1].held and 1 not in h.closed  # its worker function is ended by the pool
    assert h.s.counters["a"].timeout_reclaim_count == 1


def test_a_hello_for_a_returned_worker_function_abandons_the_task():
    h = Harness()
    h.returned.add(-7)
    h.open(1)
    h.frames((1, [wire.encode_hello("a", -7)]))
    assert h.abandoned == ["a", "b"] and 1 in h.closed


# ------------------------------------------------------------------ the task's tail (net/tail.py)
def _at_tail_with_three_clients(retries):
    """Clients 1-3 of ``a`` (4 blocks): 1 keeps its block (the straggler), 2 and 3 ask at the tail."""
    h = Harness(n_a=4, n_b=1, retries=retries)
    for c in (1, 2, 3):
        h.open(c)
        h.frames((c, [wire.encode_hello("a", c), REQ]))
    h.open(4)
    h.frames((4, [wire.encode_hello("a", 4), REQ]))  # the fourth block
    h.frames((4, [rel(h.blocks(4)[0])]))  # no block left: nothing ready, nothing pending
    h.frames((2, [rel(h.blocks(2)[0])]), (3, [rel(h.blocks(3)[0])]))
    return h


def test_at_the_tail_every_client_that_asks_is_told_to_end_when_no_retry_can_come():
    h = _at_tail_with_three_clients(retries=0)
    for c in (2, 3, 4):
        assert h.inbox[c][-1] is wire.NO_MORE
    assert sorted(h.jobs.released) == [2, 3, 4]  # their worker functions' returns are clean ends
    assert not h.core.parked and list(h.core.conns[1].held) == h.blocks(1)  # the straggler runs on


def test_at_the_tail_one_client_is_kept_and_takes_the_retry_of_a_block_that_fails():
    h = _at_tail_with_three_clients(retries=1)
    told = [c for c in (2, 3, 4) if h.inbox[c][-1] is wire.NO_MORE]
    (kept,) = [c for c in (2, 3, 4) if h.core.conns.get(c) is not None and h.core.conns[c].parked]
    assert len(told) == 2 and kept not in told
    h.core.serve_parked(h.now)  # nothing changed: it stays, and is told nothing
    h.run()
    assert h.core.conns[kept].parked and h.inbox[kept][-1] is not wire.NO_MORE
    (straggler,) = h.blocks(1)
    h.core.lost(1)  # its job dies: the block fails, a retry is due
    h.run()
    assert h.s.ready_count("a") == 1
    h.core.serve_parked(h.now)  # the kept client takes it at once: no job has to be started for it
    h.run()
    h.core.validate()
    assert h.blocks(kept)[-1] == straggler and not h.core.conns[kept].parked
    h.frames((kept, [rel(straggler)]))
    assert h.s.task_states["a"].completed_count == 4 and h.inbox[kept][-1] is wire.NO_MORE


def b_behind_a_straggler(h: Harness, ask_again: bool = True) -> tuple[int, list[int], int]:
    """Client 1 runs a straggler of ``a`` (3 blocks), client 2 ran ``a``'s others and was told to
    end; ``b``'s three clients asked, two ran a block each and asked again (told to end: ``b``'s
    last block is pending on the straggler; ``ask_again`` False: they still run theirs), one
    waits parked for it. Returns the straggler, the two that ran and the one that waits."""
    for c in (1, 2):
        h.open(c)
    h.frames((1, [HELLO_A, REQ]), (2, [wire.encode_hello("a", 2), REQ]))
    (straggler,) = h.blocks(1)
    while h.core.conns[2].held:  # client 2 runs a's other blocks; a's tail ends it (or keeps it for a retry)
        h.frames((2, [rel(next(iter(h.core.conns[2].held)))]))
    for c in (3, 4, 5):
        h.open(c)
    h.frames(*[(c, [wire.encode_hello("b", c), REQ]) for c in (3, 4, 5)])
    busy = [c for c in (3, 4, 5) if h.blocks(c)]
    (waiting,) = [c for c in (3, 4, 5) if not h.blocks(c)]
    assert len(busy) == 2 and h.core.conns[waiting].parked
    if ask_again:
        h.frames(*[(c, [rel(h.blocks(c)[0])]) for c in busy])  # done, and asking again: b has one pending block
    return straggler, busy, waiting


def test_a_downstream_task_keeps_only_as_many_clients_as_blocks_can_still_come():
    """``b`` waits on one straggler of ``a``: of its three clients, one stays parked for the one
    pending block, the others are told to end; the one kept takes the block once it is ready."""
    h = Harness(n_a=3, n_b=3, retries=0)
    straggler, busy, waiting = b_behind_a_straggler(h)
    assert all(h.inbox[c][-1] is wire.NO_MORE for c in busy)
    assert h.core.conns[waiting].parked
    h.core.serve_parked(h.now)  # nothing changed: the kept client waits on
    h.run()
    assert h.core.conns[waiting].parked and not h.blocks(waiting)
    h.frames((1, [rel(straggler)]))  # the straggler is done: b's last block is ready
    h.core.serve_parked(h.now)
    h.run()
    assert len(h.blocks(waiting)) == 1 and not h.core.conns[waiting].parked


def test_a_client_waiting_for_a_pending_block_waits_no_longer_than_a_job_takes_to_start():
    """``b``'s last block waits on a straggler of ``a``: the client kept for it is told to end
    once it has waited as long as a new job takes to start (2 s), not for the straggler's whole
    length; when the block is ready, nobody waits for it (the spawn plan starts a job)."""
    h = Harness(n_a=3, n_b=3, retries=0)
    h.jobs.start_secs = 2.0
    straggler, _, waiting = b_behind_a_straggler(h)
    h.now += 1_900 * MS
    h.core.serve_parked(h.now)
    h.run()
    assert h.core.conns[waiting].parked, "told to end before it waited as long as a job takes to start"
    h.now += 200 * MS
    h.core.serve_parked(h.now)
    h.run()
    check_tail(h.core, h.trs, h.now)
    assert h.inbox.get(waiting, [])[-1:] == [wire.NO_MORE], "kept for the straggler's whole length"
    assert not h.core.parked.get(h.trs["b"])
    h.frames((1, [rel(straggler)]))  # the straggler is done: b's last block is ready, for a new job
    assert h.s.ready_count("b") == 1


def test_a_job_waits_from_its_first_ask_not_from_its_hello():
    """A job that sets up after its hello (a model it loads: 3 s here) and then asks for a block that
    is pending is not told to end for having "waited" while it set up: its wait starts at its
    ask. What a job takes to start is measured to that first ask."""
    h = Harness(n_a=1, n_b=1, retries=0)
    h.jobs.start_secs = 2.0
    h.open(1)
    h.frames((1, [HELLO_A, REQ]))
    assert at_tail(h.s, "a"), "a's one block is in flight"
    h.open(2)
    h.frames((2, [wire.encode_hello("b", 2)]))  # hello, then its set-up
    h.now += 3_000 * MS
    h.frames((2, [REQ]))  # b's blocks wait on a's: pending
    assert h.core.conns[2].parked and h.inbox.get(2, [])[-1:] != [wire.NO_MORE]
    assert h.jobs.ready == [0, 2], "the first ask is what a job's start is measured to"
    h.now += 2_100 * MS  # waited as long as a job takes to start: told to end
    h.core.serve_parked(h.now)
    h.run()
    assert h.inbox[2][-1] is wire.NO_MORE


def test_a_downstream_job_waits_while_the_upstream_task_still_hands_out_blocks():
    """``b`` waits on ``a``, whose one client runs a block every 5 s: while ``a`` still hands out
    blocks, ``b``'s job waits 5 s for each of its blocks, longer than a job takes to start (2 s),
    and stays (ending it would start a job per block); once ``a``'s last block is in flight, it
    waits no longer than a job takes to start."""
    h = Harness(n_a=6, n_b=6, retries=0)
    h.jobs.start_secs = 2.0
    h.open(1)
    h.frames((1, [HELLO_A, REQ]))
    h.open(2)
    h.frames((2, [wire.encode_hello("b", 2), REQ]))
    ran = 0
    while not at_tail(h.s, "a"):
        h.now += 5_000 * MS
        h.core.serve_parked(h.now)
        h.run()
        check_tail(h.core, h.trs, h.now)
        assert h.inbox.get(2, [])[-1:] != [wire.NO_MORE], "told to end while a still hands out blocks"
        h.frames((1, [rel(next(iter(h.core.conns[1].held)))]))  # a's block done: b's is ready
        h.core.serve_parked(h.now)
        h.run()
        for i in list(h.core.conns[2].held):  # b's job runs it at once, and asks again
            h.frames((2, [rel(i)]))
            ran += 1
    assert ran == 5 and h.core.conns[2].parked  # b's last block waits on a's last, in flight
    h.now += 2_100 * MS
    h.core.serve_parked(h.now)
    h.run()
    check_tail(h.core, h.trs, h.now)
    assert h.inbox[2][-1] is wire.NO_MORE


def test_the_kept_client_waits_no_longer_than_a_job_takes_to_start():
    """Ski rental: kept for a retry that may never come, a client is told to end once it has waited
    as long as a new job takes to start (here 2 s); before that, it stays."""
    h = _at_tail_with_three_clients(retries=1)
    h.jobs.start_secs = 2.0
    (kept,) = [c for c, cc in h.core.conns.items() if cc.parked]
    h.now += 1_900 * MS
    h.core.serve_parked(h.now)
    h.run()
    assert h.core.conns[kept].parked
    h.now += 200 * MS
    h.core.serve_parked(h.now)
    h.run()
    assert not h.core.parked and h.inbox[kept][-1] is wire.NO_MORE
    assert kept in h.jobs.released  # its worker function's return is a clean end


def test_no_second_client_is_kept_for_a_retry_once_the_first_waited_in_vain():
    """Ski rental, once per tail: two stragglers of ``a`` run (clients 1, 2); client 3, kept for a
    retry, waits as long as a job takes to start (2 s) and ends. When client 1's straggler is done
    and it asks, it is told to end at once, not kept for another 2 s: the rent was paid. Once a
    block fails and its retry is handed out, a client may be kept again."""
    h = Harness(n_a=4, n_b=1, retries=2)
    h.jobs.start_secs = 2.0
    for c in (1, 2, 3):
        h.open(c)
        h.frames((c, [wire.encode_hello("a", c), REQ]))
    h.frames((3, [rel(h.blocks(3)[0])]))  # the fourth block, then a's tail: 3 is kept for a retry
    h.frames((3, [rel(h.blocks(3)[-1])]))
    assert at_tail(h.s, "a") and h.core.conns[3].parked
    h.now += 2_100 * MS
    h.core.serve_parked(h.now)
    h.run()
    assert h.inbox[3][-1] is wire.NO_MORE, "kept for a retry longer than a job takes to start"
    h.frames((1, [rel(h.blocks(1)[0])]))  # a straggler done; its client asks at the tail
    check_tail(h.core, h.trs, h.now)
    assert h.inbox[1][-1] is wire.NO_MORE and not h.core.parked.get(h.trs["a"]), "the rent paid twice"
    (straggler,) = h.blocks(2)
    h.frames((2, [rel(straggler, 3)]))  # it fails: its retry goes to client 2 at once
    assert h.blocks(2)[-1] == straggler
    h.open(4)
    h.frames((4, [wire.encode_hello("a", 4), REQ]))  # a job that asks now may be kept again
    assert h.core.conns[4].parked and h.inbox.get(4, []) == []


def test_a_pass_that_drains_the_upstream_judges_the_downstream_jobs_again():
    """``b``'s job has waited a job's start for ``b``'s one block, behind ``a``'s, which is ready
    again (its job died). The pass that hands it out drains ``a``: the same call ends ``b``'s job,
    rather than the next turn of the loop."""
    h = Harness(n_a=1, n_b=1, retries=1)
    h.jobs.start_secs = 0.05
    for c in range(3):
        h.open(c)
    h.frames((0, [wire.encode_hello("b", 0), REQ]))  # waits for b's block, behind a's
    h.now += 50 * MS
    h.frames((1, [wire.encode_hello("a", 1), REQ]))
    h.frames((2, [wire.encode_hello("a", 2), REQ]))  # a's one block is in flight: parked for a retry
    h.core.lost(1)  # a's block is ready again
    h.run()
    h.core.serve_parked(h.now)
    h.run()
    assert h.blocks(2) and h.s.ready_count("a") == 0  # a's retry went out: a is drained
    assert h.inbox[0][-1] is wire.NO_MORE
    check_settled(h)


def test_no_second_client_waits_for_a_pending_block_once_one_waited_in_vain():
    """``b``'s last block waits on a straggler of ``a`` (drained): the client parked for it waits
    as long as a job takes to start and ends. A client of ``b`` that finishes its block and asks
    afterwards is told to end at once instead of waiting another 2 s for the same block; when the
    straggler is done, the block is ready for a new job, and the rentals start again."""
    h = Harness(n_a=3, n_b=3, retries=0)
    h.jobs.start_secs = 2.0
    straggler, busy, waiting = b_behind_a_straggler(h, ask_again=False)
    h.now += 2_100 * MS
    h.core.serve_parked(h.now)
    h.run()
    assert h.inbox[waiting][-1] is wire.NO_MORE
    h.frames((busy[0], [rel(h.blocks(busy[0])[0])]))  # b's one pending block: its rent was paid
    check_tail(h.core, h.trs, h.now)
    assert h.inbox[busy[0]][-1] is wire.NO_MORE, "a second job waited for the same pending block"
    h.frames((1, [rel(straggler)]))  # the straggler is done: b's last block is ready
    assert h.s.ready_count("b") == 1
    h.frames((busy[1], [rel(h.blocks(busy[1])[0])]))  # a job asks: it takes it
    assert len(h.blocks(busy[1])) == 2 and h.core.tail.bought("b") == 0


def _run_on(h: Harness, cid: int, turns: int = 80) -> None:
    """The run goes on until it is done: every 100 ms the parked clients are served, every client
    holding a block finishes it, and a new job (client ``cid``, ``cid + 1``...) comes for a task
    with blocks ready and no client parked."""
    for _ in range(turns):
        if h.s.is_done():
            break
        h.now += 100 * MS
        h.core.serve_parked(h.now)
        h.run()
        check_settled(h)
        held = [(c, [rel(i)]) for c, cc in sorted(h.core.conns.items()) if cc.held for i in cc.held]
        if held:
            h.frames(*held)
        for tid in ("a", "b"):
            if not h.core.parked.get(h.trs[tid]) and h.s.ready_count(tid):
                h.open(cid)
                h.frames((cid, [wire.encode_hello(tid, cid), REQ]))
                cid += 1
    assert h.s.is_done(), "the run did not finish"


@given(
    steps=st.lists(
        st.sampled_from(["wait", "long wait", "serve", "b asks", "b runs", "straggler ends", "straggler fails"]),
        max_size=40,
    )
)
@settings(max_examples=200, deadline=None)
def test_behind_a_straggler_no_rent_is_paid_twice_and_every_block_still_runs(steps):
    """``b`` waits on a straggler of ``a`` (retries left; a job takes 2 s to start). In any order of
    time passing, the parked jobs served, ``b``'s jobs asking or running their blocks and the
    straggler ending or failing: no job waits where one already waited in vain (``check_tail``
    after every serve), and once jobs come for what is ready the run ends, every block done or
    failed for good."""
    h = Harness(n_a=3, n_b=3, retries=1)
    h.jobs.start_secs = 2.0
    straggler, busy, waiting = b_behind_a_straggler(h, ask_again=False)
    cid = 10
    for step in steps:
        if step in ("wait", "long wait"):
            h.now += (300 if step == "wait" else 2_100) * MS
        elif step == "serve":
            h.core.serve_parked(h.now)
            h.run()
            check_settled(h)
        elif step == "b asks":  # a new job of b (the spawn plan's, or one that was queued)
            h.open(cid)
            h.frames((cid, [wire.encode_hello("b", cid), REQ]))
            cid += 1
        elif step == "b runs":  # every b job holding a block finishes it and asks again
            pairs = [(c, [rel(i)]) for c, cc in sorted(h.core.conns.items()) if cc.tr is h.trs["b"] for i in cc.held]
            if pairs:
                h.frames(*pairs)
        elif 1 in h.core.conns and straggler in h.core.conns[1].held:
            h.frames((1, [rel(straggler, 2 if step == "straggler ends" else 3)]))
        h.core.validate()
    _run_on(h, cid)
    for tid in ("a", "b"):  # every block ended: done, or failed for good (the straggler twice) and orphaned
        st_ = h.s.task_states[tid]
        assert st_.completed_count + st_.failed_count + st_.orphaned_count == 3, f"task {tid}: {st_}"


def _a_straggler_then_blocks_of(h: Harness, secs: float, ahead: bool = False, lead_ms: int = 0) -> int:
    """Client 1 starts ``a``'s straggler; ``lead_ms`` later client 2 runs ``a``'s other blocks,
    ``secs`` each (the median); ``ahead``: client 2 keeps the last one it was sent ahead of its
    running one."""
    for c in (1, 2):
        h.open(c)
    h.frames((1, [HELLO_A, REQ]))
    (straggler,) = h.blocks(1)
    h.now += lead_ms * MS
    h.frames((2, [wire.encode_hello("a", 2), REQ]))
    while h.core.conns[2].held and not (ahead and len(h.core.conns[2].held) == 2):
        h.now += int(secs * 1e9)
        h.frames((2, [rel(next(iter(h.core.conns[2].held)))]))
    return straggler


def _pace(h: Harness, producers: tuple[int, ...], consumers: tuple[int, ...], rounds: int) -> None:
    """``rounds`` of 100 ms: each producer of ``a`` releases its running block; the blocks of ``b``
    that became ready go to its parked consumers, which run each for 10 ms and ask again."""
    for _ in range(rounds):
        h.now += 90 * MS
        for c in producers:
            h.frames((c, [rel(next(iter(h.core.conns[c].held)))]))
        h.core.serve_parked(h.now)
        h.run()
        h.now += 10 * MS
        for c in consumers:
            cc = h.core.conns.get(c)
            for i in list(cc.held) if cc is not None and not cc.ended else ():
                h.frames((c, [rel(i)]))
        check_tail(h.core, h.trs, h.now)


def test_a_downstream_task_ends_the_job_its_slowed_upstream_cannot_feed():
    """``a`` has two jobs, one of them held by a straggler; ``b``'s two jobs take ``a``'s blocks
    faster than the other one makes them, and wait in turns. Once they have waited, together and
    beyond half a job, as long as a job takes to start (0.3 s), the next that asks with nothing
    ready is told to end; the last one stays for ``b``'s pending blocks however long it waits
    (net/tail.py: "Downstream jobs at the upstream's pace"). From then on ``b`` is paced: its
    busy job counts, for the spawn plan, for the blocks it takes within a job's start."""
    h = Harness(n_a=60, n_b=60, retries=0)
    h.jobs.start_secs = 0.3
    for c, t in ((1, "a"), (2, "a"), (3, "b"), (4, "b")):
        h.open(c)
        h.frames((c, [wire.encode_hello(t, c), REQ]))
    assert h.core.conns[2].held, "a's second job runs its straggler all along"
    _pace(h, (1,), (3, 4), 3)
    assert not [c for c in (3, 4) if wire.NO_MORE in h.inbox.get(c, [])], "ended before a job's start was waited"
    _pace(h, (1,), (3, 4), 20)
    ended = [c for c in (3, 4) if h.inbox.get(c, [])[-1:] == [wire.NO_MORE]]
    assert len(ended) == 1 and "b" in h.core.tail.paced
    (left,) = {3, 4} - set(ended)
    _pace(h, (1,), (left,), 30)  # it waits 90 ms of every 100 for a's next block, and stays
    assert wire.NO_MORE not in h.inbox[left] and not at_tail(h.s, "b")
    h.now += 10 * MS
    h.frames((1, [rel(next(iter(h.core.conns[1].held)))]))
    h.core.serve_parked(h.now)
    h.run()
    assert h.core.conns[left].held and h.core.soon_free(h.trs["b"], h.now) == 30  # 0.3 s of 10 ms blocks


def test_downstream_jobs_that_keep_pace_with_their_upstream_all_stay():
    """``a``'s two jobs feed ``b``'s two, whose blocks take as long as ``a``'s: a ``b`` job waits a few
    ms for each block, far below half a job, and none is told to end; ``b`` is not paced."""
    h = Harness(n_a=250, n_b=250, retries=0)
    h.jobs.start_secs = 0.3
    for c, t in ((1, "a"), (2, "a"), (3, "b"), (4, "b")):
        h.open(c)
        h.frames((c, [wire.encode_hello(t, c), REQ]))
    for _ in range(100):  # every 100 ms a's jobs release a block each; b's take them 2 ms later
        h.now += 98 * MS
        for c in (3, 4):
            for i in list(h.core.conns[c].held):
                h.frames((c, [rel(i)]))
        h.now += 2 * MS
        for c in (1, 2):
            h.frames((c, [rel(next(iter(h.core.conns[c].held)))]))
        h.core.serve_parked(h.now)
        h.run()
        check_tail(h.core, h.trs, h.now)
    assert not any(wire.NO_MORE in h.inbox.get(c, []) for c in (3, 4)) and "b" not in h.core.tail.paced
    assert h.core.soon_free(h.trs["b"], h.now) == 0


@given(
    start=st.sampled_from([0.05, 0.3, 1.0]),
    steps=st.lists(
        st.sampled_from(
            ["a block", "a block", "b runs", "b runs", "b asks", "wait", "long wait", "b dies", "straggler"]
        ),
        max_size=60,
    ),
)
@settings(max_examples=200, deadline=None)
def test_the_upstreams_pace_never_ends_a_tasks_last_job_and_every_block_still_runs(start, steps):
    """``a``'s client 2 runs a straggler while client 1 runs the rest; ``b``'s jobs come, run, ask,
    wait and die in any order. Whenever a job of ``b`` is told to end while ``a`` still hands out
    blocks (the upstream's pace: net/tail.py), another job of ``b`` stays; whatever the order,
    once jobs come for what is ready, every block runs."""
    h = Harness(n_a=20, n_b=20, retries=0)
    h.jobs.start_secs = start
    b = h.trs["b"]
    for c, t in ((1, "a"), (2, "a"), (3, "b"), (4, "b")):
        h.open(c)
        h.frames((c, [wire.encode_hello(t, c), REQ]))
    straggler = h.blocks(2)[0]
    cid = 10
    for step in steps:
        told = {c for c, cc in h.core.conns.items() if cc.tr is b and cc.ended}
        if step == "a block":  # client 1 finishes a block; the parked clients are served (the pool's turn)
            h.now += 50 * MS
            if h.core.conns[1].held:
                h.frames((1, [rel(next(iter(h.core.conns[1].held)))]))
            h.core.serve_parked(h.now)
            h.run()
            check_settled(h)
        elif step == "b runs":
            h.now += 20 * MS
            pairs = [
                (c, [rel(next(iter(cc.held)))]) for c, cc in sorted(h.core.conns.items()) if cc.tr is b and cc.held
            ]
            if pairs:
                h.frames(*pairs)
        elif step == "b asks":
            h.open(cid)
            h.frames((cid, [wire.encode_hello("b", cid), REQ]))
            cid += 1
        elif step in ("wait", "long wait"):
            h.now += (100 if step == "wait" else 1_000) * MS
        elif step == "b dies":
            live = [c for c, cc in sorted(h.core.conns.items()) if cc.tr is b]
            if live:
                h.core.lost(live[0])
                h.run()
        elif 2 in h.core.conns and h.core.conns[2].held:  # the straggler ends
            h.frames((2, [rel(straggler)]))
        now_told = {c for c, cc in h.core.conns.items() if cc.tr is b and cc.ended} - told
        if now_told and not h.core.tail.upstream_drained("b"):
            event("a job of b ended at the upstream's pace")
            stay = [c for c, cc in h.core.conns.items() if cc.tr is b and not cc.ended]
            assert stay, "the upstream's pace ended the task's last job"
    if 2 in h.core.conns and h.core.conns[2].held:
        h.frames((2, [rel(straggler)]))
    _run_on(h, cid)


def test_no_client_waits_for_a_pending_block_only_behind_stragglers():
    """``b``'s last block waits on ``a``'s straggler (a job takes 2 s to start, ``a``'s median is
    0.1 s): a client of ``b`` that asks once the straggler has run 2 s (and 4 medians) is told to
    end at once, without paying the rent; one that asked before waits, and is told to end on the
    serve after the straggler has run that long, though it waited less than a job's start. When
    the straggler is done, the block is ready for a new job (``net/tail.py``, "Behind stragglers")."""
    h = Harness(n_a=3, n_b=3, retries=0)
    h.jobs.start_secs = 2.0
    t0 = h.now
    straggler = _a_straggler_then_blocks_of(h, 0.1)
    for c in (3, 4, 5):
        h.open(c)
    h.frames(*[(c, [wire.encode_hello("b", c), REQ]) for c in (3, 4, 5)])
    (waiting,) = [c for c in (3, 4, 5) if not h.blocks(c)]
    busy = [c for c in (3, 4, 5) if h.blocks(c)]
    assert h.core.conns[waiting].parked
    h.now = t0 + 1_500 * MS  # the straggler has run 1.5 s, less than a job's start
    h.core.serve_parked(h.now)
    h.run()
    assert h.core.conns[waiting].parked, "told to end behind a block that is no straggler yet"
    assert h.running()("a") == [1.5]
    h.now = t0 + 2_050 * MS  # 2.05 s: the waiting client waited 1.85 s
    h.core.serve_parked(h.now)
    h.run()
    assert h.inbox[waiting][-1] is wire.NO_MORE and not h.core.parked
    assert h.core.tail.bought("b") == 0  # no rent paid
    check_tail(h.core, h.trs, h.now)
    h.frames((busy[0], [rel(h.blocks(busy[0])[0])]))  # a client that asks now ends at once
    assert h.inbox[busy[0]][-1] is wire.NO_MORE
    h.frames((1, [rel(straggler)]))
    assert h.s.ready_count("b") == 1
    h.frames((busy[1], [rel(h.blocks(busy[1])[0])]))  # a job that asks takes it
    assert len(h.blocks(busy[1])) == 2


def test_the_client_kept_for_a_retry_is_told_to_end_once_the_blocks_in_flight_are_stragglers():
    """At ``a``'s tail (retries left, a job takes 2 s to start, median 0.5 s) one client is kept for
    a retry of the straggler; once the straggler has run 2 s it is told to end, having waited 1.5 s,
    less than a job's start: the rent would most likely be paid in vain."""
    h = Harness(n_a=4, n_b=1, retries=1)
    h.jobs.start_secs = 2.0
    t0 = h.now
    _a_straggler_then_blocks_of(h, 0.5)
    assert h.core.conns[2].parked and h.now == t0 + 1_500 * MS
    h.now = t0 + 1_950 * MS
    h.core.serve_parked(h.now)
    h.run()
    assert h.core.conns[2].parked, "told to end before the straggler ran a job's start"
    h.now = t0 + 2_050 * MS
    h.core.serve_parked(h.now)
    h.run()
    assert h.inbox[2][-1] is wire.NO_MORE and not h.core.parked
    check_tail(h.core, h.trs, h.now)


def test_a_block_sent_ahead_counts_as_long_as_the_one_before_it_and_one_no_client_holds_is_unknown():
    """The time each block of a task in flight has run, as the tail's rule sees it: a block sent
    ahead starts when its connection's running block ends, so it counts as long as that one
    (young behind a young block, a straggler's time behind a straggler); a task whose blocks in
    flight are not all held by connections has no answer, and nobody is told to end on it."""
    h = Harness(n_a=20, n_b=1, retries=1)
    h.jobs.start_secs = 2.0
    _a_straggler_then_blocks_of(h, 0.001, ahead=True, lead_ms=3_000)  # fast blocks: one goes ahead
    held = list(h.core.conns[2].held)
    assert len(held) == 2
    running = h.running()
    straggler, young, ahead = running("a")
    assert straggler > 3.0 and young == ahead < 0.1
    assert not h.core.tail.behind_stragglers("a", True, h.now)
    h.now += 2_500 * MS  # client 2's block has run 2.5 s too: what it holds is behind a straggler
    running = h.running()
    assert running("a")[1:] == [2.5, 2.5]
    assert h.core.tail.behind_stragglers("a", True, h.now)
    h.core.conns[2].held.pop(held[-1])  # as if a block were in flight elsewhere (a local worker)
    assert running("a") is None
    assert not h.core.tail.behind_stragglers("a", True, h.now)


@given(
    conflict=st.booleans(),
    young=st.booleans(),
    steps=st.lists(
        st.sampled_from(["wait", "long wait", "serve", "b asks", "b runs", "young ends", "straggler ends"]),
        max_size=40,
    ),
)
@settings(max_examples=300, deadline=None)
def test_jobs_behind_stragglers_end_and_every_block_still_runs(conflict, young, steps):
    """``a``'s straggler runs (a job takes 1 s to start, ``a``'s median is 0.1 s), ``young``: beside
    a block of ``a`` that has just started; ``b``'s jobs come and ask at any time, run their blocks,
    and time passes. After every serve nobody is parked behind stragglers only (``check_tail``);
    a job that asks behind the young block stays for it; whatever the order, once jobs come for
    what is ready every block runs (``b`` with or without ``read_write_conflict``)."""
    h = Harness(n_a=5, n_b=4, retries=1, conflict=conflict)
    h.jobs.start_secs = 1.0
    for c in (1, 2):
        h.open(c)
    h.frames((1, [HELLO_A, REQ]))
    (straggler,) = h.blocks(1)
    h.frames((2, [wire.encode_hello("a", 2), REQ]))
    while h.core.conns[2].held and (h.s.ready_count("a") or not young):  # a's other blocks, 0.1 s each
        h.now += 100 * MS
        h.frames((2, [rel(next(iter(h.core.conns[2].held)))]))
    assert bool(h.core.conns.get(2) and h.core.conns[2].held) == young  # young: its last one has just started
    cid = 10
    for step in steps:
        if step in ("wait", "long wait"):
            h.now += (200 if step == "wait" else 1_100) * MS
        elif step == "serve":
            h.core.serve_parked(h.now)
            h.run()
            check_settled(h)
        elif step == "b asks":
            h.open(cid)
            h.frames((cid, [wire.encode_hello("b", cid), REQ]))
            behind = h.core.tail.behind_stragglers("b", False, h.now)
            event(f"b's pending blocks behind stragglers only: {behind}")
            if young and 2 in h.core.conns and h.core.conns[2].held:
                if (h.now - max(h.core.conns[2].held.values())) / 1e9 < 1.0:
                    assert not behind, "a block of a that is no straggler yet is in flight"
            cid += 1
        elif step == "b runs":
            pairs = [(c, [rel(i)]) for c, cc in sorted(h.core.conns.items()) if cc.tr is h.trs["b"] for i in cc.held]
            if pairs:
                h.frames(*pairs)
        elif step == "young ends":
            if 2 in h.core.conns and h.core.conns[2].held:
                h.frames((2, [rel(next(iter(h.core.conns[2].held)))]))
        elif 1 in h.core.conns and straggler in h.core.conns[1].held:
            h.frames((1, [rel(straggler)]))
        h.core.validate()
    _run_on(h, cid)
    assert [h.s.task_states[t].completed_count for t in "ab"] == [5, 4]


@pytest.mark.parametrize("how", ["finishes", "fails_for_good"])
def test_the_kept_client_is_told_to_end_once_no_retry_can_come(how):
    h = _at_tail_with_three_clients(retries=1)
    (kept,) = [c for c, cc in h.core.conns.items() if cc.parked]
    (straggler,) = h.blocks(1)
    if how == "fails_for_good":  # its retry runs on client 1 again: on its last attempt, nobody is kept for it
        h.frames((1, [rel(straggler, 3)]))
        assert h.blocks(1)[-1] == straggler
    h.core.serve_parked(h.now)
    h.run()
    assert (kept in h.core.conns and h.core.conns[kept].parked) == (how == "finishes")
    h.frames((1, [rel(straggler, 2 if how == "finishes" else 3)]))
    h.core.serve_parked(h.now)
    h.run()
    assert not h.core.parked and h.inbox[kept][-1] is wire.NO_MORE


# ------------------------------------------------------------------ walltime (the job's end is known)
def _median_of_100ms(h, cid=9):
    """Client ``cid`` (no end known) runs two blocks of ``a`` of 100 ms each: the median is 0.1 s."""
    h.open(cid)
    h.frames((cid, [wire.encode_hello("a", cid), REQ]))
    for _ in range(2):
        h.now += 100 * MS
        h.frames((cid, [rel(next(iter(h.core.conns[cid].held)))]))  # the block it runs
    assert statistics.median(h.trs["a"].block_secs) == pytest.approx(0.1)
    h.frames((cid, [wire.encode_goodbye()]))


def test_a_job_whose_end_is_near_is_told_to_end_instead_of_getting_a_block():
    h = Harness(n_a=20, n_b=1)
    _median_of_100ms(h)
    ready = h.s.ready_count("a")
    h.open(1)
    h.open(2)
    h.frames((1, [wire.encode_hello("a", 1, 0.19), REQ]), (2, [wire.encode_hello("a", 2, 0.21), REQ]))
    assert h.inbox[1] == [wire.NO_MORE] and 1 in h.jobs.released  # a clean end, as at the tail
    assert h.core.conns[1].ended and not h.core.conns[1].parked
    assert len(h.blocks(2)) == 1 and h.s.ready_count("a") == ready - 1  # enough time: a block
    assert h.core.counts["walltime"] == 1


def test_no_rule_before_a_block_of_the_task_finished_nor_without_a_known_end():
    h = Harness(n_a=4, n_b=1)
    h.open(1)
    h.open(2)
    h.frames((1, [wire.encode_hello("a", 1, 0.001), REQ]), (2, [HELLO_A, REQ]))
    assert len(h.blocks(1)) == 1 and len(h.blocks(2)) == 1  # no median yet: no rule
    h.now += 100 * MS
    h.frames((2, [rel(h.blocks(2)[0])]))
    assert len(h.blocks(2)) == 2  # no end known: blocks as before
    h.frames((1, [rel(h.blocks(1)[0])]))
    assert h.inbox[1][-1] is wire.NO_MORE and h.core.counts["walltime"] == 1


def test_a_block_goes_ahead_only_while_the_time_left_covers_the_running_one_too():
    h = Harness(n_a=40, n_b=1)
    _median_of_100ms(h)
    h.open(1)
    h.open(2)
    h.frames((1, [wire.encode_hello("a", 1, 0.35), REQ]), (2, [wire.encode_hello("a", 2, 10.0), REQ]))
    h.now += 100 * MS  # 0.25 s left for 1: a block (0.2 s), not one behind it (0.3 s)
    h.frames((1, [rel(h.blocks(1)[0])]), (2, [rel(h.blocks(2)[0])]))
    assert statistics.median(h.trs["a"].block_secs) == pytest.approx(0.1)
    assert len(h.core.conns[1].held) == 1 and len(h.core.conns[2].held) == 2
    h.now += 100 * MS  # 0.15 s left: told to end
    h.frames((1, [rel(h.blocks(1)[-1])]))
    assert h.inbox[1][-1] is wire.NO_MORE and not h.core.conns[1].held


def test_a_parked_job_whose_time_runs_short_is_told_to_end():
    """``b`` waits on a straggler of ``a``: its job with a known end waits parked for the pending
    block, and is told to end once its time left is under twice ``b``'s median block time."""
    h = Harness(n_a=3, n_b=3, retries=0)
    h.open(1)
    h.frames((1, [HELLO_A, REQ]))
    h.frames((1, [rel(h.blocks(1)[0])]))
    h.frames((1, [rel(h.blocks(1)[1])]))  # a0 and a1 done; 1 holds a2 (the straggler)
    assert list(h.core.conns[1].held) == [h.blocks(1)[2]]
    h.open(2)
    h.frames((2, [wire.encode_hello("b", 2, 1.0), REQ]))
    for _ in range(2):  # b's two ready blocks, 100 ms each
        h.now += 100 * MS
        h.frames((2, [rel(h.blocks(2)[-1])]))
    assert h.core.conns[2].parked and len(h.blocks(2)) == 2  # b's last block waits on a2
    h.now += 500 * MS  # 0.3 s left: still enough
    h.core.serve_parked(h.now)
    h.run()
    check_walltime(h.core, h.now)
    assert h.core.conns[2].parked
    h.now += 150 * MS  # 0.15 s left: under 0.2 s
    h.core.serve_parked(h.now)
    h.run()
    h.core.validate()
    check_walltime(h.core, h.now)
    assert not h.core.parked and h.inbox[2][-1] is wire.NO_MORE and 2 in h.jobs.released


def test_the_hello_carries_the_seconds_left():
    for left in (None, 0.0, 12.5, -3.0):
        msg = wire.decode_client(wire.encode_hello("t:é", 7, left))
        assert msg == wire.Hello(7, "t:é", left)
    assert wire.decode_client(wire.encode_hello("t", 7, float("nan"))).secs_left is None


# ------------------------------------------------------------------ the state machines
def check_settled(h: Harness) -> None:
    """After the parked clients were served (the pool does it every turn of its loop): at a task's
    tail at most one client is kept, and only while a retry can come; a ready block (a retry) is
    never left without a worker: no client stays parked while blocks are ready, and the spawn plan
    starts a worker function for ready blocks no parked client takes."""
    if h.core.stopped:
        return
    check_tail(h.core, h.trs, h.now)
    for tid, tr in h.trs.items():
        if at_tail(h.s, tid) and h.core.parked.get(tr):
            event("a client kept at a task's tail")
        parked = len(h.core.parked.get(tr, ()))
        if h.s.is_abandoned(tid) or h.s.ready_count(tid) == 0:
            continue
        assert parked == 0, f"task {tid!r}: {parked} clients parked while blocks are ready"
        plan = plan_spawns([TaskNeed(tid, h.s.ready_count(tid), 0, parked, 4)], Budget({}), 4)
        assert plan.start, f"task {tid!r}: ready blocks and no worker started for them"


CIDS = st.integers(0, 5)


class HandOutMachine(RuleBasedStateMachine):
    """Random event sequences against the real Scheduler; the invariants after every step."""

    @initialize(
        n_a=st.integers(1, 12),
        n_b=st.integers(0, 6),
        retries=st.integers(0, 2),
        timeout=st.sampled_from([None, 30 * MS]),
        keeps=st.booleans(),
        fail=st.sets(st.integers(0, 5), max_size=1),
    )
    def setup(self, n_a, n_b, retries, timeout, keeps, fail):
        self.h = Harness(max(1, n_a), max(1, n_b), retries, timeout, keeps, fail)
        self.opened: set[int] = set()
        self.next_cid = 0
        self.sent_to: dict[tuple[str, int], int] = {}  # (task, block) -> the connection that has it now

    def _live(self):
        return sorted(c for c in self.opened if c not in self.h.closed)

    @rule()
    def open(self):
        c = self.next_cid
        self.next_cid += 1
        self.opened.add(c)
        self.h.open(c)

    def _payloads(self, data, c):
        h = self.h
        held = list(h.core.conns[c].held) if c in h.core.conns else []
        got = h.blocks(c)
        idx = st.sampled_from(held + got[-3:] + [999]) if held or got else st.just(999)
        one = st.one_of(
            st.builds(
                wire.encode_hello,
                st.sampled_from(["a", "b", "zz"]),
                st.integers(-8, 3),
                st.one_of(st.none(), st.floats(-1.0, 10.0), st.sampled_from([float("inf"), float("nan")])),
            ),
            st.just(REQ),
            st.just(REQ),
            st.builds(rel, idx, st.sampled_from([2, 2, 3])),
            st.builds(lambda i: wire.encode_failure(i, 0, "ValueError", "x", "tb"), idx),
            st.builds(wire.encode_give_back, idx),
            st.just(wire.encode_goodbye()),
            st.just(wire.encode_ping()),
        )
        return data.draw(st.lists(one, min_size=1, max_size=3))

    @precondition(lambda self: self._live())
    @rule(data=st.data())
    def a_pass(self, data):
        live = self._live()
        chosen = data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=len(live), unique=True))
        pairs = [(c, self._payloads(data, c)) for c in chosen]
        if data.draw(st.booleans()):  # a hello first, as real clients do
            for c, ps in pairs:
                if self.h.core.conns[c].tr is None:
                    ps.insert(0, wire.encode_hello(data.draw(st.sampled_from(["a", "b"])), c))
        self.h.frames(*pairs)

    @precondition(lambda self: self._live())
    @rule(data=st.data())
    def lost(self, data):
        self.h.core.lost(data.draw(st.sampled_from(self._live())))
        self.h.run()

    @precondition(lambda self: self._live())
    @rule(data=st.data())
    def broken(self, data):
        self.h.core.broken(data.draw(st.sampled_from(self._live())), "test")
        self.h.run()

    @rule(ms=st.integers(1, 7000))
    def clock(self, ms):
        h = self.h
        h.now += ms * MS
        h.core.heartbeats(h.now)
        h.core.check_timeouts(h.now)
        h.run()

    @rule()
    def serve_parked(self):
        self.h.core.serve_parked(self.h.now)
        self.h.run()
        check_settled(self.h)

    @rule(tid=st.sampled_from(["a", "b"]))
    def abandon(self, tid):
        if not self.h.s.is_abandoned(tid):
            self.h.abandon(tid, "test")
            self.h.run()

    @rule()
    def ctrl_c(self):
        self.h.core.abort()
        self.h.core.stop()
        self.h.run()

    @rule()
    def close_all(self):
        self.h.core.close_all()
        self.h.run()

    @invariant()
    def consistent(self):
        if not hasattr(self, "h"):
            return
        h = self.h
        h.core.validate()
        owner: dict[tuple[str, int], int] = {}
        for cid, cc in h.core.conns.items():
            assert cid not in h.closed
            for i in cc.held:
                assert (cc.tr.tid, i) not in owner
                owner[(cc.tr.tid, i)] = cid
                assert i in h.blocks(cid), "held a block that was never sent to it"
        for cid in h.closed:
            assert cid not in h.core.conns
        total = sum(h.s.processing_count(t) for t in ("a", "b"))
        assert total == len(owner)


TestHandOutMachine = HandOutMachine.TestCase
TestHandOutMachine.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


class TailMachine(RuleBasedStateMachine):
    """Well-behaved clients (a hello, then a request or the release of the block they run), jobs that
    die, blocks that fail: runs that reach a task's tail, where clients are told to end or kept."""

    @initialize(
        n_a=st.integers(1, 8),
        n_b=st.integers(1, 3),
        retries=st.integers(0, 2),
        start=st.sampled_from([None, 0.05, 0.5]),
        conflict=st.booleans(),
    )
    def setup(self, n_a, n_b, retries, start, conflict):
        self.h = Harness(n_a, n_b, retries, conflict=conflict)
        self.h.jobs.start_secs = start  # a job takes this long to start: a kept one waits no longer
        self.next_cid = 0

    @rule(ms=st.integers(1, 400))
    def time_passes(self, ms):
        self.h.now += ms * MS

    def _live(self):
        return sorted(self.h.core.conns)

    @precondition(lambda self: self.next_cid < 6)
    @rule()
    def open(self):
        self.h.open(self.next_cid)
        self.next_cid += 1

    @precondition(lambda self: self._live())
    @rule(data=st.data())
    def a_pass(self, data):
        live = self._live()
        chosen = data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=len(live), unique=True))
        pairs = []
        for c in chosen:
            cc = self.h.core.conns[c]
            if cc.tr is None:
                pairs.append((c, [wire.encode_hello(data.draw(st.sampled_from(["a", "b"])), c), REQ]))
            elif cc.held:
                pairs.append((c, [rel(next(iter(cc.held)), data.draw(st.sampled_from([2, 2, 3])))]))
            elif not cc.parked:
                pairs.append((c, [REQ]))
        if pairs:
            self.h.frames(*pairs)

    @precondition(lambda self: self._live())
    @rule(data=st.data())
    def job_dies(self, data):
        self.h.core.lost(data.draw(st.sampled_from(self._live())))
        self.h.run()

    @rule()
    def serve_parked(self):
        self.h.core.serve_parked(self.h.now)
        self.h.run()
        check_settled(self.h)

    @invariant()
    def valid(self):
        if hasattr(self, "h"):
            self.h.core.validate()


TestTailMachine = TailMachine.TestCase
TestTailMachine.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


class WalltimeMachine(RuleBasedStateMachine):
    """Well-behaved clients, some of whose jobs end at a known time (their hello's seconds left),
    on a fake clock: blocks of random lengths, jobs that die, parked clients served."""

    @initialize(n_a=st.integers(1, 10), n_b=st.integers(1, 4), retries=st.integers(0, 2))
    def setup(self, n_a, n_b, retries):
        self.h = Harness(n_a, n_b, retries)
        self.next_cid = 0
        self.end: dict[int, int] = {}  # client -> when its job ends (ns), if known
        self.t_free: dict[int, int] = {}  # client -> when its previous block ended (or it connected)
        self.sent: dict[tuple[int, int], int] = {}  # (client, block) -> when it received it
        self.secs: dict[str, deque] = {"a": deque(maxlen=64), "b": deque(maxlen=64)}  # finished block times

    @rule(ms=st.integers(1, 200))
    def time_passes(self, ms):
        self.h.now += ms * MS

    @precondition(lambda self: self.next_cid < 8)
    @rule(left_ms=st.one_of(st.none(), st.integers(-100, 1500), st.integers(-100, 1500)))
    def open(self, left_ms):
        c = self.next_cid
        self.next_cid += 1
        self.h.open(c)
        self.t_free[c] = self.h.now
        if left_ms is not None:
            self.end[c] = self.h.now + left_ms * MS

    def _seen(self):
        return {c: len(self.h.blocks(c)) for c in self.h.core.conns}

    def _check_sent(self, before: dict[int, int]) -> None:
        """Every block sent in the step just done went to a client whose time left covered
        ``WALLTIME_FACTOR`` medians, plus one per block it held before it."""
        h = self.h
        for c, n in before.items():
            cc = h.core.conns.get(c)
            for b in h.blocks(c)[n:]:
                self.sent[(c, b)] = h.now
                if cc is None or c not in self.end or b not in cc.held:
                    continue
                secs = self.secs[cc.tr.tid]
                if not secs:
                    continue
                med = statistics.median(secs)
                k = list(cc.held).index(b)
                # 1 µs: the hello's seconds left are a float
                assert self.end[c] - h.now >= (WALLTIME_FACTOR + k) * med * 1e9 - 1000, (c, b, k, med)
                event("a block for a job whose end is known")

    @precondition(lambda self: self.h.core.conns)
    @rule(data=st.data())
    def a_pass(self, data):
        h = self.h
        live = sorted(h.core.conns)
        chosen = data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=len(live), unique=True))
        pairs = []
        for c in chosen:
            cc = h.core.conns[c]
            if cc.tr is None:
                t = data.draw(st.sampled_from(["a", "b"]))
                left = None if c not in self.end else (self.end[c] - h.now) / 1e9
                pairs.append((c, [wire.encode_hello(t, c, left), REQ]))
            elif cc.held:
                b = next(iter(cc.held))
                self.secs[cc.tr.tid].append((h.now - max(self.sent[(c, b)], self.t_free[c])) / 1e9)
                self.t_free[c] = h.now
                pairs.append((c, [rel(b, data.draw(st.sampled_from([2, 2, 3])))]))
            elif not cc.parked and not cc.ended:
                pairs.append((c, [REQ]))
        if not pairs:
            return
        before = self._seen()
        told = len(h.jobs.released)
        h.frames(*pairs)
        self._check_sent(before)
        for tid in ("a", "b"):  # the clients' view of the finished blocks is the core's
            assert list(self.secs[tid]) == pytest.approx(list(h.trs[tid].block_secs))
        if h.core.counts["walltime"] and len(h.jobs.released) > told:
            event("a job told to end for its walltime")

    @precondition(lambda self: self.h.core.conns)
    @rule(data=st.data())
    def job_dies(self, data):
        self.h.core.lost(data.draw(st.sampled_from(sorted(self.h.core.conns))))
        self.h.run()

    @rule()
    def serve_parked(self):
        h = self.h
        before = self._seen()
        n = h.core.counts["walltime"]
        h.core.serve_parked(h.now)
        h.run()
        self._check_sent(before)
        check_walltime(h.core, h.now)
        check_settled(h)
        if h.core.counts["walltime"] > n:
            event("a parked job told to end for its walltime")

    @invariant()
    def valid(self):
        if not hasattr(self, "h"):
            return
        h = self.h
        h.core.validate()
        for c, cc in h.core.conns.items():
            if cc.ended:  # told to end: a clean end of its worker function
                assert c in h.jobs.released


TestWalltimeMachine = WalltimeMachine.TestCase
TestWalltimeMachine.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
