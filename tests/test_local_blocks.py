"""The block workers' decision core (``daisy_nb.runtime.local.blocks``) against the real Scheduler.

No processes: the test plays the workers. A hypothesis state machine starts workers,
finishes their batches (wholly or partly, blocks failing), makes blocks raise, kills
workers at any point (holding a running and a prefetched batch, mid-batch, before they
were ready), lets blocks time out, abandons a task; after every step
:meth:`BlockCore.validate` checks the invariants (every block in exactly one batch of
one worker; per task, the blocks in batches are the scheduler's processing count; busy
exactly when holding batches; parked never busy); once the parked workers tried again,
none is parked at its task's tail (``blocks.check_tail``) and ready blocks (retries) no
waiting worker takes make the spawn plan start one. Plus the decisions the end-to-end
tests used to observe by monkeypatching ``Processes._send_batch`` (prefetch of fast
blocks, none of slow ones, what a death with two batches gives back).
"""

import numpy as np
import pytest
from funlib.geometry import Roi
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import daisy_nb
from daisy_nb.block import BlockStatus
from daisy_nb.runtime.local.blocks import BlockCore, Kill, Quit, Retask, SendBatch, WorkerState, check_tail
from daisy_nb.runtime.local.budget import Budget, TaskNeed, plan_spawns
from daisy_nb.runtime.local.exits import ExitKind

CAPACITY = 64
MAX_WORKERS = 4  # per task, for the spawn plan and for workers that move between tasks


def noop(block):
    pass


def make_task(tid, n, **kw):
    return daisy_nb.Task(
        tid,
        Roi((0,), (10 * n,)),
        Roi((0,), (10,)),
        Roi((0,), (10,)),
        process_function=noop,
        tracking_path=False,
        **kw,
    )


def scheduler(n=40, conflict=False, retries=2, second=False):
    a = make_task("a", n, read_write_conflict=conflict, max_retries=retries)
    if second:
        return daisy_nb.Scheduler(a + make_task("b", n // 2, read_write_conflict=False, max_retries=retries))
    return daisy_nb.Scheduler([a], block_tracking=False)


class Worker:
    """What the test knows of a worker's shared memory: per slot, the statuses the worker wrote."""

    def __init__(self):
        self.slots: dict[int, np.ndarray] = {}
        self.order: list[int] = []  # slots in run order


class CoreMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.s = None
        self.core = None
        self.w: dict[int, Worker] = {}
        self.next_wid = 0
        self.now = 0

    @initialize(
        n=st.one_of(st.integers(1, 8), st.integers(1, 300)),  # small tasks reach their tail in a few steps
        conflict=st.booleans(),
        retries=st.integers(0, 2),
        second=st.booleans(),
        reuse=st.booleans(),
    )
    def start(self, n, conflict, retries, second, reuse):
        self.s = scheduler(n, conflict, retries, second)
        self.core = BlockCore(self.s, target_secs=0.01, capacity=CAPACITY)
        for tid in self.s.task_ids:
            self.core.add_task(tid, timeout_ns=10**9)
            if reuse:  # a worker with nothing left in its task may serve the other (runtime/local/reuse.py)
                self.core.reuse.add_task(tid, MAX_WORKERS, self.s.task_ids)

    def apply(self, actions):
        for a in actions:
            if isinstance(a, SendBatch):
                w = self.w[a.wid]
                assert a.slot not in w.slots, "a batch sent into a slot that holds one"
                w.slots[a.slot] = np.zeros(len(a.blocks.index), np.uint8)
                w.order.append(a.slot)
            elif isinstance(a, (Quit, Kill)):
                assert a.wid in self.core.workers
            elif isinstance(a, Retask):  # it starts again, as the other task's: ready comes later
                cw = self.core.workers[a.wid]
                assert cw.tid == a.tid and cw.state == WorkerState.STARTING and not cw.queue
                assert not self.w[a.wid].order, "a worker moved while it holds batches"
                event("a worker moved to another task")
            else:
                raise AssertionError(a)

    def statuses(self, wid):
        w = self.w[wid]
        return [w.slots[k] for k in w.order]

    def forget(self, wid):
        w = self.w[wid]
        for k in w.order:
            del w.slots[k]
        w.order.clear()

    def live(self):
        return sorted(self.core.workers) if self.core is not None else []

    @rule(task=st.sampled_from(["a", "b"]))
    @precondition(lambda self: self.s is not None)
    def spawn(self, task):
        if task not in self.s.task_ids or self.s.is_task_done(task):
            return
        wid = self.next_wid
        self.next_wid += 1
        self.w[wid] = Worker()
        self.core.add(wid, task)

    @rule(data=st.data())
    @precondition(lambda self: self.s is not None and self.core.workers)
    def ready(self, data):
        wid = data.draw(st.sampled_from(self.live()))
        self.apply(self.core.ready(wid))

    @rule(data=st.data(), fail=st.floats(0, 1), elapsed=st.integers(0, 10**7))
    @precondition(lambda self: self.s is not None and any(w.queue for w in self.core.workers.values()))
    def batch_done(self, data, fail, elapsed):
        busy = [wid for wid in self.live() if self.core.workers[wid].state == WorkerState.BUSY]
        if not busy:
            return
        wid = data.draw(st.sampled_from(busy))
        w = self.w[wid]
        k = w.order[0]
        st_ = w.slots[k]
        rng = np.random.default_rng(len(st_) + elapsed)
        st_[:] = np.where(rng.random(len(st_)) < fail / 3, BlockStatus.FAILED, BlockStatus.SUCCESS)
        done = st_.copy()
        w.order.pop(0)
        del w.slots[k]
        self.apply(self.core.batch_done(wid, done, elapsed))
        event("batch done")

    @rule(data=st.data(), fail=st.floats(0, 1), elapsed=st.integers(0, 10**6))
    @precondition(lambda self: self.s is not None and any(w.queue for w in self.core.workers.values()))
    def fast_batch_done(self, data, fail, elapsed):
        self.batch_done(data, fail, elapsed)

    @rule(data=st.data(), ran=st.integers(0, 10))
    @precondition(lambda self: self.s is not None and any(w.queue for w in self.core.workers.values()))
    def block_raises(self, data, ran):
        busy = [wid for wid in self.live() if self.core.workers[wid].state == WorkerState.BUSY]
        if not busy:
            return
        wid = data.draw(st.sampled_from(busy))
        st_ = self.w[wid].slots[self.w[wid].order[0]]
        i = min(ran, len(st_) - 1)
        st_[:i] = BlockStatus.SUCCESS
        st_[i] = BlockStatus.FAILED
        self.core.batch_raised(wid, self.statuses(wid))
        self.forget(wid)
        assert self.core.workers[wid].state == WorkerState.QUITTING

    @rule(data=st.data(), ran=st.integers(0, 10), rc=st.sampled_from([0, 3, -9, -11]), orphaned=st.booleans())
    @precondition(lambda self: self.s is not None and self.core.workers)
    def dies(self, data, ran, rc, orphaned):
        """A worker's process ends at any point: mid-batch, holding a prefetched batch, idle, starting."""
        wid = data.draw(st.sampled_from(self.live()))
        cw = self.core.workers[wid]
        sts = self.statuses(wid)
        if sts:  # mid-batch: ``ran`` blocks finished, the next one running
            first = sts[0]
            i = min(ran, len(first))
            first[:i] = BlockStatus.SUCCESS
            if i < len(first):
                first[i] = BlockStatus.PROCESSING
        told = cw.expected_exit
        before = self.s.counters[cw.tid].worker_failure_count
        rep = self.core.exited(wid, sts, rc, orphaned=orphaned)
        event(f"died holding {len(sts)} batches")
        self.forget(wid)
        assert wid not in self.core.workers
        if told or orphaned:
            assert rep.kind is ExitKind.STOPPED or rep.kind is ExitKind.TIMEOUT
        else:
            # a local block worker's death is a crash, whatever it finished (never a job end)
            assert rep.kind in (ExitKind.CRASH, ExitKind.TIMEOUT)
        assert self.s.counters[cw.tid].worker_failure_count == before  # counting is the shell's

    @rule(data=st.data(), secs=st.floats(0, 3))
    @precondition(lambda self: self.s is not None and self.core.workers)
    def tick(self, data, secs):
        self.now += int(secs * 1e9)
        started = {}
        for wid in self.live():
            if self.core.workers[wid].state == WorkerState.BUSY and data.draw(st.booleans()):
                started[wid] = self.now - int(data.draw(st.floats(0, 2)) * 1e9)
        for a in self.core.tick(self.now, started):
            event("timeout")
            assert isinstance(a, Kill)
            assert self.now - started[a.wid] > 10**9
            assert self.core.workers[a.wid].timed_out

    @rule()
    @precondition(lambda self: self.s is not None and self.core.workers)
    def every_started_worker_ready(self):
        """The workers that were starting are ready together (as a burst of forks is), then the pool's turn."""
        for wid in self.live():
            if self.core.workers[wid].state == WorkerState.STARTING:
                self.apply(self.core.ready(wid))
        self.parked_try_again()

    @rule()
    @precondition(lambda self: self.s is not None)
    def parked_try_again(self):
        self.apply(self.core.dispatch_parked())
        check_settled(self.core)

    @rule()
    @precondition(lambda self: self.s is not None and self.s.is_done())
    def drain(self):
        acts = self.core.drain()
        assert all(isinstance(a, Quit) for a in acts)

    @rule(task=st.sampled_from(["a", "b"]), dice=st.integers(0, 9))
    @precondition(lambda self: self.s is not None)
    def abandon(self, task, dice):
        if dice or task not in self.s.task_ids or self.s.is_abandoned(task):
            return
        for tid in self.s.abandon_task(task, "test"):
            acts = self.core.end_task(tid)
            event("abandoned")
            for a in acts:
                assert isinstance(a, (Quit, Kill))

    @invariant()
    def valid(self):
        if self.core is not None:
            self.core.validate()
            for wid, cw in self.core.workers.items():
                assert len(cw.queue) == len(self.w[wid].order)
                for (k, index), k2 in zip(cw.queue, self.w[wid].order):
                    assert k == k2 and len(index) == len(self.w[wid].slots[k])


def check_settled(core: BlockCore) -> None:
    """Once the parked workers tried again (the pool does it every turn of its loop): none is parked at
    its task's tail (it quit), and a ready block (a retry) is never left without a worker: a waiting
    worker takes it, or the spawn plan starts one."""
    check_tail(core)
    s = core.s
    for tid in s.task_ids:
        if core.nothing_left(tid) and core.of_task.get(tid):
            event("workers at a task's tail")
        if s.is_abandoned(tid) or s.is_task_done(tid):
            continue
        parked = [w for w in core.of_task.get(tid, ()) if w.state == WorkerState.PARKED]
        for w in parked:
            if core.nothing_left(tid):  # check_tail's, said plainly: only to serve the other task
                other = core.reuse.waits_for(w)
                assert other is not None, f"task {tid!r}: a worker parked at its tail"
                assert not core.nothing_left(other) and core.alive(other) < MAX_WORKERS
                event("a worker waits at its tail for the other task")
        ready, alive, waiting = s.ready_count(tid), core.alive(tid), core.waiting(tid)
        if ready and not waiting and alive < MAX_WORKERS:
            event("a ready block and no waiting worker")
            plan = plan_spawns([TaskNeed(tid, ready, alive, waiting, MAX_WORKERS)], Budget({}), 4)
            assert plan.start, f"task {tid!r}: {ready} ready blocks and no worker started for them"


TestCoreMachine = CoreMachine.TestCase
TestCoreMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


# ------------------------------------------------------------------ the decisions, one by one
def run_until_done(core, s, wids, per_block_ns, limit=10_000):
    """Play workers that run every batch at ``per_block_ns`` a block; returns the batches sent as
    ``(wid, depth after the send, blocks)``."""
    pending = {wid: [] for wid in wids}  # wid -> [(slot, n)]
    sent = []

    def apply(acts):
        for a in acts:
            if isinstance(a, SendBatch):
                pending[a.wid].append((a.slot, len(a.blocks.index)))
                sent.append((a.wid, len(pending[a.wid]), len(a.blocks.index)))

    for wid in wids:
        apply(core.ready(wid))
    for _ in range(limit):
        if s.is_done():
            break
        apply(core.dispatch_parked())
        for wid in wids:
            if pending[wid]:
                _, n = pending[wid].pop(0)
                apply(core.batch_done(wid, np.full(n, BlockStatus.SUCCESS, np.uint8), per_block_ns * n))
                core.validate()
    assert s.is_done()
    return sent


def two_workers(n: int):
    """A one-task scheduler of ``n`` blocks and a core with two workers of it (10 ms batch target)."""
    s = scheduler(n)
    core = BlockCore(s, target_secs=0.01, capacity=CAPACITY)
    core.add_task("a")
    for wid in (0, 1):
        core.add(wid, "a")
    return s, core


def test_fast_blocks_are_prefetched_and_every_block_runs_once():
    s, core = two_workers(600)
    sent = run_until_done(core, s, [0, 1], per_block_ns=100_000)  # 0.1 ms blocks
    assert max(depth for _, depth, _ in sent) == 2  # a second batch waited behind a running one
    assert sum(n for _, _, n in sent) == 600  # every block handed out once
    assert s.task_states["a"].completed_count == 600


def test_slow_blocks_are_sent_ahead_one_at_a_time_while_the_ready_blocks_last():
    s, core = two_workers(12)
    sent = run_until_done(core, s, [0, 1], per_block_ns=50_000_000)  # 50 ms blocks: slower than the target
    assert all(n == 1 for _, _, n in sent)  # one block per batch
    assert max(depth for _, depth, _ in sent) == 2  # one waited behind a running one: no round trip between
    assert sum(n for _, _, n in sent) == 12 and s.task_states["a"].completed_count == 12
    # near the end (fewer ready blocks than a running and a queued one per worker) none waits
    assert [depth for _, depth, _ in sent[-2:]] == [1, 1]


def test_blocks_longer_than_a_second_are_never_sent_ahead():
    s, core = two_workers(12)
    sent = run_until_done(core, s, [0, 1], per_block_ns=2_000_000_000)  # 2 s blocks
    assert sent and all(depth == 1 and n == 1 for _, depth, n in sent)


@pytest.mark.parametrize("aborting", [False, True])
def test_death_with_a_prefetched_batch_gives_back_what_it_never_started(aborting):
    s = scheduler(1500)
    core = BlockCore(s, target_secs=0.01, capacity=CAPACITY)
    core.add_task("a")
    core.add(0, "a")
    core.add(1, "a")
    acts = core.ready(0) + core.ready(1)
    # grow the batches until worker 0 holds two
    for _ in range(50):
        for wid in (0, 1):
            w = core.workers[wid]
            if len(w.queue) == 2:
                break
            n = len(w.queue[0][1])
            acts = core.batch_done(wid, np.full(n, BlockStatus.SUCCESS, np.uint8), 10_000 * n)
        if len(core.workers[0].queue) == 2:
            break
    w0 = core.workers[0]
    assert len(w0.queue) == 2
    (_, run_idx), (_, next_idx) = w0.queue
    done_before = s.task_states["a"].completed_count
    first = np.zeros(len(run_idx), np.uint8)
    first[:2] = BlockStatus.SUCCESS
    first[2] = BlockStatus.PROCESSING  # it died in the third block of its running batch
    second = np.zeros(len(next_idx), np.uint8)  # the prefetched batch: never started
    if aborting:
        core.abort()
    rep = core.exited(0, [first, second], -9)
    core.validate()
    st_ = s.task_states["a"]
    assert st_.completed_count == done_before + 2
    # the block it was running failed (an attempt) unless the run was aborting; the rest given back
    assert st_.failed_count == 0
    assert s.ready_count("a") >= len(run_idx) - 3 + len(next_idx)
    assert rep.kind is (ExitKind.STOPPED if aborting else ExitKind.CRASH)
    assert rep.was_busy and rep.finished > 2
    del acts


def test_timeout_kills_only_a_block_running_too_long():
    s = scheduler(10)
    core = BlockCore(s, target_secs=0.01, capacity=CAPACITY)
    core.add_task("a", timeout_ns=500_000_000)
    core.add(0, "a")
    core.add(1, "a")
    core.ready(0)
    core.ready(1)
    assert core.tick(10**9, {0: 10**9 - 400_000_000}) == []
    assert core.tick(10**9, {0: 10**9 - 600_000_000, 1: 10**9}) == [Kill(0)]
    assert core.tick(2 * 10**9, {0: 0}) == []  # killed once
    assert s.counters["a"].timeout_reclaim_count == 1


def test_at_the_tail_a_worker_quits_and_a_retry_gets_a_new_one():
    """A worker with nothing to take while the last block runs quits (its slot is free); when the
    worker running that block dies, the spawn plan starts a worker for its retry, which gets it."""
    s = scheduler(2, retries=1)
    core = BlockCore(s, target_secs=0.01, capacity=CAPACITY)
    core.add_task("a")
    core.add(0, "a")
    core.add(1, "a")
    core.ready(0)
    core.ready(1)  # one block each
    ok = np.full(1, BlockStatus.SUCCESS, np.uint8)
    assert core.batch_done(0, ok, 50_000_000) == [Quit(0)]  # the tail: it quits, no parking
    check_tail(core)
    assert core.alive("a") == 1 and core.waiting("a") == 0  # only the straggler's worker counts
    core.exited(1, [np.full(1, BlockStatus.PROCESSING, np.uint8)], -9)  # dies in its block
    core.exited(0, [], 0)
    core.validate()
    assert s.ready_count("a") == 1 and core.alive("a") == 0  # the retry, and no worker
    plan = plan_spawns([TaskNeed("a", s.ready_count("a"), core.alive("a"), core.waiting("a"), 2)], Budget({}), 4)
    assert plan.start == ["a"]  # one worker, for the one retry
    core.add(2, "a")
    (send,) = core.ready(2)
    assert isinstance(send, SendBatch) and send.blocks.index.tolist() == [1]


def test_bad_statuses_from_a_worker_raise():
    s = scheduler(4)
    core = BlockCore(s, target_secs=0.01, capacity=CAPACITY)
    core.add_task("a")
    core.add(0, "a")
    (send,) = [a for a in core.ready(0) if isinstance(a, SendBatch)]
    n = len(send.blocks.index)
    with pytest.raises(RuntimeError, match="SUCCESS/FAILED"):
        core.batch_done(0, np.full(n, BlockStatus.PROCESSING, np.uint8), 1000)
    core.add(1, "a")  # starting: holds no batch
    with pytest.raises(RuntimeError, match="holds none"):
        core.batch_done(1, np.zeros(0, np.uint8), 0)


# ------------------------------------------------------------------ which workers start (budget.plan_spawns)
@settings(max_examples=200, deadline=None)
@given(
    tasks=st.lists(
        st.tuples(
            st.integers(0, 20),  # ready
            st.integers(0, 4),  # alive
            st.integers(0, 4),  # waiting
            st.integers(1, 6),  # max_workers
            st.integers(0, 3),  # cpu required
            st.booleans(),  # closed
        ),
        min_size=1,
        max_size=5,
    ),
    cpus=st.integers(0, 8),
    burst=st.integers(1, 6),
)
def test_spawn_plan_respects_every_limit(tasks, cpus, burst):
    from daisy_nb.runtime.local.budget import Budget, TaskNeed, plan_spawns

    budget = Budget({"cpu": cpus})
    needs = [
        TaskNeed(f"t{i}", r, a, min(w, a), m, {"cpu": c} if c else {}, closed=x)
        for i, (r, a, w, m, c, x) in enumerate(tasks)
    ]
    before = {n.tid: (n.alive, n.waiting) for n in needs}
    plan = plan_spawns(needs, budget, burst)
    assert len(plan.start) <= burst
    assert budget.used == {"cpu": 0}  # the plan does not take the budget
    used = 0
    for n, (r, a, w, m, c, x) in zip(needs, tasks):
        k = plan.start.count(n.tid)
        used += k * c
        if x:
            assert k == 0
        assert before[n.tid][0] + k <= max(m, before[n.tid][0])  # max_workers
        assert k <= max(0, r - before[n.tid][1])  # only for ready blocks no waiting worker can take
    assert used <= cpus
    if plan.more:
        assert len(plan.start) == burst
    for tid in plan.free_for:
        (c,) = [t[4] for n, t in zip(needs, tasks) if n.tid == tid]
        assert c > 0  # only a task that needs a resource asks for one to be freed


# ------------------------------------------------------------------ restarts as daisy 2.0.0 counts them
def test_restarts_count_every_replacement_and_the_cap_counts_crashes():
    """Crashes and (worker-function) job ends interleaved: every replacement after a dirty exit is a
    restart (``worker_restart_count``, the wheel's ``failures > restarts``); only crashes count toward
    ``max_worker_restarts``."""
    from daisy_nb.runtime.common.failures import count_worker_failure
    from daisy_nb.runtime.local.pool_parts import PoolTaskRun
    from daisy_nb.scheduler import WorkerCounters

    tr = PoolTaskRun(make_task("a", 4, read_write_conflict=False, max_worker_restarts=2))
    c = WorkerCounters()
    tr.restarts.started(c)  # the first worker: not a restart
    assert (c.worker_start_count, c.worker_restart_count) == (1, 0)
    for job_end in (True, False, True, True, False, True):
        count_worker_failure(c, job_end)
        assert not tr.restarts.cap_reached(c)
        tr.restarts.started(c)  # its replacement
    assert (c.worker_failure_count, c.worker_job_end_count, c.worker_restart_count) == (6, 4, 6)
    assert tr.restarts.crashes_replaced == 2
    count_worker_failure(c, job_end=True)  # the cap is used up: a job end is still replaced
    assert not tr.restarts.cap_reached(c)
    tr.restarts.started(c)
    count_worker_failure(c, job_end=False)  # a third crash is not
    assert tr.restarts.cap_reached(c)
    assert c.worker_restart_count == 7 and c.worker_start_count == 8


@pytest.mark.parametrize("cap", [0, 1, 3])
def test_a_crash_loop_stops_after_the_cap(cap):
    from daisy_nb.runtime.common.failures import count_worker_failure
    from daisy_nb.runtime.local.pool_parts import PoolTaskRun
    from daisy_nb.scheduler import WorkerCounters

    tr = PoolTaskRun(make_task("a", 4, read_write_conflict=False, max_worker_restarts=cap))
    c = WorkerCounters()
    tr.restarts.started(c)
    for _ in range(cap + 5):
        count_worker_failure(c, job_end=False)
        if tr.restarts.cap_reached(c):
            break
        tr.restarts.started(c)
    assert c.worker_restart_count == cap and c.worker_failure_count == cap + 1
