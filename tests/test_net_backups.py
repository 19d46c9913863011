"""Backup copies of stragglers for ``Client`` jobs (``daisy_nb.runtime.net.backups``), without sockets.

The hand-out core (:class:`daisy_nb.runtime.net.handout.HandOut`) against the real Scheduler
with a fake clock (the harness of ``test_net_handout.py``): a speculative task keeps its parked
jobs at its tail, a straggler gets a copy on one of them, the first success counts, the other
copy is told to drop the block (``DROP``) and its report counts for nothing; a copy that fails
or is lost while its twin runs changes nothing. A hypothesis machine plays clients that obey
(they report a dropped block's end, as a real ``Client`` does after the interrupt), with jobs
that die and blocks that fail, and checks after every step the hand-out's invariants (a block
in two places only as a copy, held equal to in flight) and that every block succeeded at most
once in the Scheduler's count, exactly when some copy of it succeeded while it counted.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from test_net_handout import MS, REQ, Harness, check_settled, rel

from daisy_nb.kernels.tables import DONE
from daisy_nb.runtime.net import wire


def _drops(h: Harness, cid: int) -> list[int]:
    return [m.block for m in h.inbox.get(cid, []) if isinstance(m, wire.Drop)]


def _state(h: Harness, tid: str = "a"):
    return h.s.counts(tid)


def straggler_at_the_tail(speculative=10, n=10):
    """Client 2 runs the blocks of ``a`` (100 ms each) until one is left ready, which client 1
    takes and keeps (the straggler); client 2 ends what it holds at once and asks again: the
    task is at its tail, its straggler just started. Returns the harness and the straggler's
    block (at the tail its copy is due past 1.5 x the median, 150 ms, whatever ``k``)."""
    h = Harness(n_a=n, n_b=1, retries=1, speculative=speculative)
    for c in (1, 2):
        h.open(c)
    h.frames((1, [wire.encode_hello("a", 1)]), (2, [wire.encode_hello("a", 2), REQ]))
    while h.s.ready_count("a") > 1:
        h.now += 100 * MS
        h.frames((2, [rel(next(iter(h.core.conns[2].held)))]))
    h.now += 100 * MS
    h.frames((1, [REQ]))
    (x,) = h.blocks(1)
    while h.core.conns[2].held:  # (its last block ended as the straggler started)
        h.frames((2, [rel(next(iter(h.core.conns[2].held)))]))
    return h, x


def copy_sent(h: Harness, x: int) -> None:
    """Time passes past 1.5 x the median since the straggler started, at the tail; the pool
    serves its parked jobs."""
    assert h.core.conns[2].parked, "the job that asks at a speculative task's tail stays, for a copy"
    h.now += 200 * MS
    h.core.serve_parked(h.now)
    h.run()
    h.core.validate()
    check_settled(h)
    assert h.blocks(2)[-1] == x and list(h.core.conns[2].held) == [x], "the straggler's block went to the parked job"
    assert h.core.counts["backups"] == 1 and _state(h).processing == 1  # in flight once


def test_the_copy_wins_the_straggler_is_told_to_drop_it_and_its_report_counts_for_nothing():
    h, x = straggler_at_the_tail()
    copy_sent(h, x)
    h.now += 100 * MS
    h.frames((2, [rel(x)]))
    assert _drops(h, 1) == [x] and not h.core.conns[1].held
    st_ = _state(h)
    assert (st_.completed, st_.failed, st_.processing) == (10, 0, 0)
    assert h.inbox[2][-1] is wire.NO_MORE  # the task is done: the copy's job ends
    h.frames((1, [rel(x, 3)]))  # the interrupted straggler reports: nothing changes
    st_ = _state(h)
    assert (st_.completed, st_.failed) == (10, 0) and h.inbox[1][-1] is wire.NO_MORE


def test_the_straggler_wins_and_the_copy_is_told_to_drop_it():
    h, x = straggler_at_the_tail()
    copy_sent(h, x)
    h.frames((1, [rel(x)]))
    assert _drops(h, 2) == [x] and _drops(h, 1) == []
    h.frames((2, [rel(x)]))  # its copy also succeeded, later: counted once
    st_ = _state(h)
    assert (st_.completed, st_.failed, st_.processing) == (10, 0, 0)


def test_a_copy_that_fails_while_its_twin_runs_is_dropped_and_gets_no_third_copy():
    h, x = straggler_at_the_tail()
    copy_sent(h, x)
    h.frames((2, [wire.encode_failure(x, 0, "OSError", "slow disk", "tb"), REQ]))
    st_ = _state(h)
    assert (st_.failed, st_.processing) == (0, 1) and h.core.conns[2].parked
    h.now += 5000 * MS
    h.core.serve_parked(h.now)
    h.run()
    assert h.core.counts["backups"] == 1 and not h.core.conns[2].held, "never a third copy"
    h.frames((1, [rel(x)]))
    st_ = _state(h)
    assert (st_.completed, st_.failed, st_.processing) == (10, 0, 0)


def test_a_lost_copy_leaves_the_twin_to_decide_and_two_failures_count_once():
    h, x = straggler_at_the_tail()
    copy_sent(h, x)
    h.core.lost(2)  # the copy's job died
    h.run()
    h.core.validate()
    assert (_state(h).failed, _state(h).processing) == (0, 1)
    h.frames((1, [wire.encode_failure(x, 0, "OSError", "gone", "tb")]))  # then the straggler fails: one failure
    st_ = _state(h)
    assert (st_.failed, st_.processing, h.s.ready_count("a")) == (0, 0, 1), "retried (retries=1)"
    assert int(h.s.block_states("a").retries[x]) == 1


def test_the_straggler_lost_while_its_copy_runs_is_no_failure():
    h, x = straggler_at_the_tail()
    copy_sent(h, x)
    h.core.lost(1)
    h.run()
    h.core.validate()
    assert int(h.s.block_states("a").retries[x]) == 0 and _state(h).processing == 1
    h.frames((2, [rel(x)]))
    assert (_state(h).completed, _state(h).failed) == (10, 0)


def test_a_plain_task_launches_no_copy_and_keeps_at_most_one_job_for_a_retry():
    h, x = straggler_at_the_tail(speculative=None)
    h.now += 5000 * MS
    h.core.serve_parked(h.now)
    h.run()
    assert h.core.counts["backups"] == 0 and x not in h.blocks(2)
    assert not h.core.copies_due()  # a job parked for a retry waits for no copy: the pool wakes as usual


def test_at_the_tail_no_copy_before_the_straggler_has_run_past_one_and_a_half_medians():
    h, x = straggler_at_the_tail(speculative=20)  # k = 20: 2 s in the bulk; at the tail, 150 ms
    h.now += 150 * MS  # exactly 1.5 x the median: not longer
    h.core.serve_parked(h.now)
    h.run()
    assert h.core.counts["backups"] == 0 and h.core.conns[2].parked
    assert h.core.copies_due()  # meanwhile the pool wakes often: the copy goes out when it is due
    h.now += 10 * MS
    h.core.serve_parked(h.now)
    h.run()
    assert h.core.counts["backups"] == 1 and h.blocks(2)[-1] == x
    assert not h.core.copies_due()  # nobody waits, and the straggler had its copy


def test_the_tail_keeps_one_parked_job_per_block_in_flight_then_ends_them():
    h = Harness(n_a=10, n_b=1, retries=0, speculative=3)
    for c in (1, 2, 3, 4):
        h.open(c)
        h.frames((c, [wire.encode_hello("a", c), *([REQ] if c > 2 else [])]))
    while h.s.ready_count("a") > 2:  # clients 3 and 4 run all but two blocks, 100 ms each
        h.now += 100 * MS
        h.frames(*[(c, [rel(next(iter(h.core.conns[c].held)))]) for c in (3, 4) if h.core.conns[c].held])
    h.frames((1, [REQ]), (2, [REQ]))  # the last two: the stragglers
    stragglers = {c: h.blocks(c)[0] for c in (1, 2)}
    while h.core.conns[3].held or h.core.conns[4].held:  # the others end at once: the tail
        h.frames(*[(c, [rel(next(iter(h.core.conns[c].held)))]) for c in (3, 4) if h.core.conns[c].held])
    assert h.core.conns[3].parked and h.core.conns[4].parked  # two blocks in flight: two kept (retries=0)
    h.now += 1000 * MS
    h.core.serve_parked(h.now)
    h.run()
    h.core.validate()
    assert h.core.counts["backups"] == 2
    assert sorted(h.blocks(3)[-1:] + h.blocks(4)[-1:]) == sorted(stragglers.values())
    for c, x in stragglers.items():  # the stragglers win; the copies are dropped, their jobs end
        h.frames((c, [rel(x)]))
    assert sorted(_drops(h, 3) + _drops(h, 4)) == sorted(stragglers.values())
    for c in (3, 4):
        h.frames((c, [rel(h.blocks(c)[-1], 3)]))
        assert h.inbox[c][-1] is wire.NO_MORE
    assert (_state(h).completed, _state(h).failed) == (10, 0)


def straggler_in_the_bulk(n=40):
    """Client 1 keeps its first block; clients 2 and 3 run the others, 100 ms each, until one of
    them asks and gets the straggler's backup (factor 3). Returns the harness, the straggler's
    block and the client running its copy."""
    h = Harness(n_a=n, n_b=1, retries=1, speculative=3)
    for c in (1, 2, 3):
        h.open(c)
        h.frames((c, [wire.encode_hello("a", c), REQ]))
    (x,) = h.blocks(1)
    for _ in range(n):
        h.now += 100 * MS
        h.frames(*[(c, [rel(next(iter(h.core.conns[c].held)))]) for c in (2, 3) if h.core.conns[c].held])
        copy = [c for c in (2, 3) if x in h.core.conns[c].held]
        if copy:
            return h, x, copy[0]
    raise AssertionError("no backup was sent")


def test_a_due_backup_goes_to_the_next_job_that_asks_before_fresh_blocks():
    """In the bulk of a task no job is parked: the straggler's copy goes to the next job that asks
    (holding nothing), while blocks are still ready; the copy wins, the straggler drops it."""
    h, x, c = straggler_in_the_bulk()
    # while the ready blocks still cover two per job (blocks are sent ahead), so the copy waited for
    # no tail: no block went ahead to the task's jobs while it was due (else none asked holding nothing)
    assert h.s.ready_count("a") > 2 * 3 and h.core.counts["backups"] == 1
    assert next(iter(h.core.conns[c].held)) == x, "a fresh block before the backup"
    h.now += 100 * MS
    h.frames((c, [rel(x)]))
    assert _drops(h, 1) == [x] and not h.core.conns[1].held
    h.frames((1, [rel(x, 3)]))  # the interrupted straggler reports: nothing changes
    done = _state(h).completed
    while any(h.core.conns[k].held for k in (1, 2, 3)):
        h.now += 100 * MS
        h.frames(*[(k, [rel(next(iter(h.core.conns[k].held)))]) for k in (1, 2, 3) if h.core.conns[k].held])
    assert (_state(h).completed, _state(h).failed) == (40, 0) and done < 40


def test_a_backup_slow_itself_is_dropped_and_the_straggler_decides():
    """The block is slow, not its first attempt: its copy, once it has run 2 x 3 x the median itself,
    is told to drop it (at the pool's timeout scan); the straggler's end counts, once."""
    h, x, c = straggler_in_the_bulk()
    h.now += 550 * MS
    h.core.check_timeouts(h.now)
    h.run()
    assert _drops(h, c) == []  # 5.5 x the median: not yet
    h.now += 100 * MS
    h.core.check_timeouts(h.now)
    h.run()
    h.core.validate()
    assert _drops(h, c) == [x] and x not in h.core.conns[c].held and x in h.core.conns[1].held
    assert h.core.counts["slow backups"] == 1 and _state(h).processing >= 1
    h.frames((c, [rel(x)]))  # the copy's late success, reported after the drop: counts for nothing
    done = _state(h).completed
    h.frames((1, [rel(x)]))
    assert _state(h).completed == done + 1 and _drops(h, 1) == []


class BackupMachine(RuleBasedStateMachine):
    """Clients that obey (a hello, requests, the release of the block they run once its drawn time
    has passed, the report of a dropped block), jobs that die, blocks that fail, on a fake clock;
    speculative tasks whose stragglers (a few blocks 30x the others) get copies when the pool
    serves its parked jobs, which it does after every pass, or when a job asks in the bulk."""

    @initialize(n_a=st.integers(8, 16), n_b=st.integers(1, 10), retries=st.integers(0, 2), k=st.sampled_from([1.5, 3]))
    def setup(self, n_a, n_b, retries, k):
        self.h = Harness(n_a, n_b, retries, speculative=k)
        self.next_cid = 0
        self.started: dict[tuple[int, int], tuple[int, int]] = {}  # (client, block) -> (start ns, its ms)
        self.unreported: dict[int, list[int]] = {}  # client -> dropped blocks whose end it has not reported
        self.seen_drops: dict[int, int] = {}  # client -> DROP frames taken into `unreported`
        self.succeeded: dict[str, set[int]] = {"a": set(), "b": set()}  # blocks a counted release succeeded

    @precondition(lambda self: self.next_cid < 8 and len(self.h.core.conns) < 4)
    @rule()
    def open(self):
        self.h.open(self.next_cid)
        self.next_cid += 1

    def _runs(self, data) -> None:
        """Each client's first held block runs from now on (if it did not already), for a drawn time."""
        for c, cc in self.h.core.conns.items():
            if cc.held and (c, next(iter(cc.held))) not in self.started:
                ms = data.draw(st.sampled_from([50, 100, 100, 150, 3000]), label="block ms")
                self.started[(c, next(iter(cc.held)))] = (self.h.now, ms)

    def _take_drops(self, c: int) -> None:
        drops = _drops(self.h, c)
        for x in drops[self.seen_drops.get(c, 0) :]:
            tid = self.h.core.conns[c].tr.tid
            twin = any(x in cc.held for k, cc in self.h.core.conns.items() if k != c and cc.tr and cc.tr.tid == tid)
            assert x in self.succeeded[tid] or twin, f"client {c} told to drop block {x}: no copy succeeded, none runs"
            if x not in self.succeeded[tid]:
                event("a slow backup told to drop its block")
            self.unreported.setdefault(c, []).append(x)
            event("a copy told to drop its block")
        self.seen_drops[c] = len(drops)

    @rule(ms=st.integers(1, 600), data=st.data())
    def time_passes(self, ms, data):
        """The clock moves; every client does what is due (one pass), then the parked jobs are served."""
        h = self.h
        h.now += ms * MS
        pairs = []
        for c, cc in list(h.core.conns.items()):
            if cc.tr is None:
                pairs.append((c, [wire.encode_hello(data.draw(st.sampled_from(["a", "b"])), c), REQ]))
            elif self.unreported.get(c):  # a dropped block's end, as a Client reports it after the interrupt
                pairs.append((c, [rel(self.unreported[c].pop(0), 3)]))
            elif cc.held:
                x = next(iter(cc.held))
                t0, run_ms = self.started[(c, x)]
                if h.now - t0 < run_ms * MS:
                    continue
                status = data.draw(st.sampled_from([2, 2, 2, 2, 3]))
                if status == 2 and h.s.block_states(cc.tr.tid).status[x] != DONE:
                    self.succeeded[cc.tr.tid].add(x)
                pairs.append((c, [rel(x, status)]))
            elif not cc.parked and not cc.ended:
                pairs.append((c, [REQ]))
        if pairs:
            h.frames(*pairs)
        n = h.core.counts["backups"]
        h.core.serve_parked(h.now)
        h.core.check_timeouts(h.now)  # (the pool's scan: backups slow themselves are dropped)
        h.run()
        check_settled(h)
        if h.core.counts["backups"] > n:
            event("a backup copy sent")
        for c in list(h.core.conns):
            self._take_drops(c)
        self._runs(data)

    @precondition(lambda self: any(cc.held for cc in self.h.core.conns.values()))
    @rule(data=st.data())
    def gives_back(self, data):
        """A client gives back a block it has not started (the one sent ahead, or its only one)."""
        h = self.h
        c = data.draw(st.sampled_from(sorted(c for c, cc in h.core.conns.items() if cc.held)))
        x = list(h.core.conns[c].held)[-1]
        self.started.pop((c, x), None)
        h.frames((c, [wire.encode_give_back(x)]))
        self._runs(data)

    @precondition(lambda self: self.h.core.conns)
    @rule(data=st.data(), die=st.integers(0, 4))
    def job_dies(self, data, die):
        if die:  # one time in five: jobs die, but not so often that no run gets to its tail
            return
        c = data.draw(st.sampled_from(sorted(self.h.core.conns)))
        self.h.core.lost(c)
        self.unreported.pop(c, None)
        self.h.run()

    @invariant()
    def valid(self):
        if not hasattr(self, "h"):
            return
        h = self.h
        h.core.validate()
        for tid in ("a", "b"):
            done = {int(i) for i in (h.s.block_states(tid).status == DONE).nonzero()[0]}
            assert done == self.succeeded[tid], (
                f"task {tid!r}: the Scheduler counts {done}, successes {self.succeeded[tid]}"
            )
            assert h.s.counts(tid).completed == len(done)
        if all(h.s.is_task_done(t) for t in ("a", "b")):
            event("the run finished")


TestBackupMachine = BackupMachine.TestCase
TestBackupMachine.settings = settings(
    max_examples=200, stateful_step_count=80, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
