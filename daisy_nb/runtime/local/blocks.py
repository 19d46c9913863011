"""The block workers' decisions, without processes, shared memory or clocks (a sans-I/O core).

:class:`BlockCore` decides which block worker gets which batch, when a second batch is
sent ahead (prefetch), when a worker parks or quits, which worker a timeout kills, and
what a worker's exit counts as; it acquires and releases blocks on the
:class:`daisy_nb.Scheduler` it holds. Everything else (processes, their sockets and
pidfds, the shared-memory segments the batches travel in, the clock) is the shell's
(:class:`.processes.Processes`), which feeds the core events and
executes the actions it returns:

* events (method calls): :meth:`BlockCore.add` (a worker was started),
  :meth:`~BlockCore.ready` (it is ready for work), :meth:`~BlockCore.batch_done` (its oldest
  batch finished: one status per block), :meth:`~BlockCore.batch_raised` (a block raised:
  the worker exits), :meth:`~BlockCore.exited` (its process ended: the statuses of the
  batches it held), :meth:`~BlockCore.tick` (the clock and when each running block
  started), :meth:`~BlockCore.straggling` (a look at every running block), and the run's :meth:`~BlockCore.dispatch_parked`, :meth:`~BlockCore.drain`,
  :meth:`~BlockCore.end_task`, :meth:`~BlockCore.quit`;
* actions (returned lists): :class:`SendBatch` (write these blocks into that batch slot and
  signal the worker), :class:`Quit` (ask it to leave), :class:`Kill` (end its process),
  :class:`~.giveback.Cut` (lower a batch's limit: a straggler's unstarted blocks are given back).

**Batching and prefetch.** How many blocks a batch holds, and whether a second batch may
wait in a busy worker's other slot (so it never idles through the round trip to the
scheduler), is :class:`.sizing.BatchSizing`'s, from the measured time per block; the core
sends a batch ahead only when no worker of the task waits for work.

**Stragglers.** A block that runs far longer than its task's blocks usually do does not
hold the rest of its batch, or a batch sent ahead, hostage: those blocks go back to the
ready queue, without a lock, never run twice (:mod:`.giveback`).

**The tail.** (Of a speculative task, workers stay parked at the tail, one per block in
flight at most, to run backup copies: :mod:`.backups`.) A worker with nothing to take while every block its task has left is in
flight (no ready and no pending block: the task's tail), or whose task is done, moves to
another task it can serve, or waits parked for one that has blocks left (:mod:`.reuse`);
else it quits at once, freeing its slot and its share of ``resources`` for the next task's
workers, instead of staying parked.
None is kept for a retry, as the TCP hand-out keeps one job
(``daisy_nb/runtime/net/tail.py``): a local worker is forked in milliseconds, so when a
block fails at the tail the pool's spawn plan (:func:`.budget.plan_spawns`, for ready
blocks no waiting worker can take) starts one for its retry. :func:`check_tail` is that
invariant once the parked workers have tried again (:meth:`BlockCore.dispatch_parked`).

**Exits.** A dead worker's finished blocks count, the block it was running fails (an
attempt; given back on Ctrl-C or when the worker template died), and the blocks of its
batches it never started are given back (status 0). Its exit is classified by
:func:`daisy_nb.runtime.local.exits.classify_exit`: a block worker's death is a crash.

Invariants (:meth:`BlockCore.validate`, checked after every event in the tests): every
block handed to a block worker is in exactly one batch of one live worker; per task,
the blocks in those batches are the scheduler's processing count (minus what the
Client side holds, ``held_elsewhere``), unless the task was abandoned; a worker is busy
exactly when it has batches; no worker is both parked and busy; at most ``slots``
batches per worker, each in a distinct slot; and :meth:`.sizing.BatchSizing.validate`'s.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from daisy_nb.block import BlockStatus
from daisy_nb.runtime.local.actions import Action, Cut, Drop, Kill, Quit, Retask, SendBatch
from daisy_nb.runtime.local.backups import DROPPED, PoolBackups
from daisy_nb.runtime.local.exits import ExitKind, classify_worker_exit
from daisy_nb.runtime.local.giveback import Running, straggling
from daisy_nb.runtime.local.reuse import Reuse
from daisy_nb.runtime.local.sizing import BatchSizing, BlockTask
from daisy_nb.runtime.local.states import WorkerState

__all__ = [
    "BlockCore",
    "BlockTask",
    "BlockWorker",
    "Cut",
    "Drop",
    "Kill",
    "Quit",
    "Retask",
    "SendBatch",
    "WorkerState",
    "check_invariants",
    "check_tail",
]

_CREATED, _PROCESSING, _SUCCESS, _FAILED = (
    BlockStatus.CREATED,
    BlockStatus.PROCESSING,
    BlockStatus.SUCCESS,
    BlockStatus.FAILED,
)


@dataclass(eq=False)
class BlockWorker:
    """The core's record of one block worker."""

    wid: int
    tid: str
    state: WorkerState = WorkerState.STARTING
    queue: deque = field(default_factory=deque)  # (slot, block rows) sent, in run order
    next_slot: int = 0
    finished: int = 0  # blocks it finished successfully
    raised: bool = False  # a block raised: it exits (dirty), not yet reaped
    timed_out: bool = False
    expected_exit: bool = False  # we told it to quit or killed it
    cuts: dict = field(default_factory=dict)  # batch slot -> giveback.CutMark: a straggler's batches cut
    doomed: bool = False  # a copy it runs lost, and no drop stopped it (backups.py): killed, nothing more sent

    @property
    def inflight(self) -> int:
        return sum(len(i) for _, i in self.queue)


@dataclass(frozen=True)
class ExitReport:
    """What :meth:`BlockCore.exited` found: the exit's kind, and for the message whether the worker
    was running blocks and how many it had finished."""

    kind: ExitKind
    was_busy: bool
    finished: int
    died_in: int  # blocks of its batches that were running or finished when it died (for the timeline)
    raised: bool = False  # a block of it raised (its error, recorded already, is the task's last)


class BlockCore:
    """The block workers' decisions (see the module docstring)."""

    def __init__(
        self,
        scheduler,
        *,
        target_secs: float,
        capacity: int,
        slots: int = 2,
        workers_total: Callable[[], int] | None = None,
    ):
        self.s = scheduler
        self.capacity = int(capacity)
        self.slots = int(slots)
        self.sizing = BatchSizing(
            target_secs=target_secs,
            capacity=capacity,
            workers_total=workers_total if workers_total is not None else lambda: len(self.workers),
        )
        self.tasks: dict[str, BlockTask] = self.sizing.tasks  # what is measured per task (read by the shell)
        self.workers: dict[int, BlockWorker] = {}
        self.of_task: dict[str, set[BlockWorker]] = {}
        self._parked: set[BlockWorker] = set()
        self.aborting = False
        self.look_again_ns: int | None = None  # a look due before the next scan: a cut to confirm, a copy
        self.backups = PoolBackups(self)  # Task(speculative=...): backup copies of stragglers
        self.reuse = Reuse(self)  # a worker with nothing left in its task serves another

    # ------------------------------------------------------------------ tasks and workers
    def add_task(self, tid: str, timeout_ns: int | None = None) -> BlockTask:
        t, new = self.sizing.add_task(tid, timeout_ns)
        if new:
            self.of_task[tid] = set()
        return t

    def add(self, wid: int, tid: str) -> BlockWorker:
        """Event: worker ``wid`` of task ``tid`` was started."""
        if wid in self.workers:
            raise ValueError(f"block worker {wid} is known already")
        self.add_task(tid)
        w = self.workers[wid] = BlockWorker(wid, tid)
        self.of_task[tid].add(w)
        return w

    def alive(self, tid: str) -> int:
        """``tid``'s workers that count toward ``max_workers`` (all but those told to quit; one whose
        block raised is replaced only once it is reaped)."""
        return sum(1 for w in self.of_task.get(tid, ()) if w.state != WorkerState.QUITTING or w.raised)

    def waiting(self, tid: str) -> int:
        """``tid``'s workers that are starting or waiting for work."""
        waiting = (WorkerState.STARTING, WorkerState.PARKED, WorkerState.IDLE)
        return sum(1 for w in self.of_task.get(tid, ()) if w.state in waiting)

    def parked_of(self, tid: str) -> list[int]:
        return sorted(w.wid for w in self.of_task.get(tid, ()) if w.state == WorkerState.PARKED)

    def parked(self) -> list[BlockWorker]:
        """Every parked worker."""
        return [w for w in self._parked if w.state == WorkerState.PARKED]

    def inflight(self, tid: str) -> int:
        """Blocks of ``tid`` in block workers' batches."""
        return sum(w.inflight for w in self.of_task.get(tid, ()))

    def _abandoned(self, tid: str) -> bool:
        return self.s.is_abandoned(tid)

    def nothing_left(self, tid: str) -> bool:
        """``tid`` is abandoned, or every block it has left is handed out already (to anybody)."""
        return self._abandoned(tid) or self.s.remaining_count(tid) - self.s.processing_count(tid) <= 0

    # ------------------------------------------------------------------------- events
    def ready(self, wid: int) -> list[Action]:
        """Event: worker ``wid`` is ready for work (its set-up is done)."""
        w = self.workers[wid]
        if w.state != WorkerState.STARTING:
            return []
        w.state = WorkerState.IDLE
        return self._dispatch(w)

    def batch_done(
        self,
        wid: int,
        status: np.ndarray,
        elapsed_ns: int,
        dispatch: bool = True,
        now_ns: int | None = None,
        secs: np.ndarray | None = None,
    ) -> list[Action]:
        """Event: the oldest batch of ``wid`` finished; ``status`` one per block (SUCCESS or FAILED),
        ``elapsed_ns`` the batch's run time, ``now_ns`` the clock (for the backups' block times),
        ``secs`` each block's own run time in ns where its worker wrote it (a speculative task's).
        ``dispatch``: False while the shell drains the messages of a worker that has died (nothing
        more is sent to it)."""
        w = self.workers[wid]
        if w.state != WorkerState.BUSY or not w.queue:
            raise RuntimeError(f"block worker {wid} reported a batch done, but it holds none (state {w.state.name})")
        slot, index = w.queue.popleft()  # batches run in the order they were sent
        mark = w.cuts.pop(slot, None)
        st = done_statuses(wid, status, len(index), mark)
        n = len(index)
        ran = int(np.count_nonzero(st >= _SUCCESS))
        w.finished += int(np.count_nonzero(st == _SUCCESS))
        self.tasks[w.tid].given_back += n - ran
        out: list[Action] = []
        if self.backups.on:  # a copied block's end that does not count is dropped; the loser is stopped
            st = st.copy()
            out = self.backups.ended(w, index, st, now_ns, elapsed_ns / max(ran, 1) / 1e9, secs)
            index, st = index[st != DROPPED], st[st != DROPPED]
        self.s.release_blocks(w.tid, index, st)  # blocks it left (a cut) go back
        if ran:
            self.sizing.measured(w.tid, elapsed_ns, ran)
        self.s.counters[w.tid].job_seconds.ran(elapsed_ns / 1e9)
        if w.queue:  # it runs the batch sent ahead
            return out + (self._prefetch(w) if dispatch else [])
        w.state = WorkerState.IDLE
        return out + (self._dispatch(w) if dispatch else [])

    def batch_raised(self, wid: int, statuses: list[np.ndarray]) -> int:
        """Event: a block of ``wid``'s running batch raised (status FAILED; none is left running): the
        worker exits (daisy 2.0's dirty exit). ``statuses``: per batch it holds, in run order. Blocks
        it ran count, the rest (of its batch, and a batch sent ahead) were never started: given back.
        Returns the blocks it ran in the batch that raised (for the timeline)."""
        w = self.workers[wid]
        if w.state != WorkerState.BUSY or not w.queue:
            raise RuntimeError(f"block worker {wid} reported a raised block, but it holds no batch")
        ran = int(np.count_nonzero(np.asarray(statuses[0][: len(w.queue[0][1])]) >= _SUCCESS))
        release_queue(self, w, statuses, _CREATED)
        w.state = WorkerState.QUITTING  # no more work for it; its exit is a dirty one (replaced once reaped)
        w.raised = True
        w.expected_exit = False
        return ran

    def exited(self, wid: int, statuses: list[np.ndarray], returncode: int, *, orphaned: bool = False) -> ExitReport:
        """Event: ``wid``'s process ended with ``returncode``; ``statuses``: per batch it held, in run
        order (as the shared memory says). Returns what the exit counts as."""
        w = self.workers.pop(wid)
        was_busy = w.state == WorkerState.BUSY
        died_in = 0
        if w.queue:
            st0 = np.asarray(statuses[0][: len(w.queue[0][1])])
            died_in = int(np.count_nonzero(st0 >= _PROCESSING))
            if self._abandoned(w.tid):  # its task was abandoned: the scheduler orphaned these blocks
                w.queue.clear()
            elif was_busy:
                # the block it was running fails (an attempt), except on Ctrl-C or with the template: given back
                release_queue(self, w, statuses, _CREATED if self.aborting or orphaned else _FAILED)
            else:
                raise RuntimeError(f"block worker {wid} held batches in state {w.state.name}")
        w.state = WorkerState.DEAD
        self.of_task[w.tid].discard(w)
        self._parked.discard(w)
        kind = classify_worker_exit(w, returncode, block_worker=True, aborting=self.aborting, orphaned=orphaned)
        return ExitReport(kind, was_busy, w.finished, died_in, w.raised)

    def tick(self, now_ns: int, started_ns: Mapping[int, int]) -> list[Action]:
        """Event: the clock. ``started_ns``: for busy workers whose batch has a running block, when it
        started. A worker whose running block exceeded its task's timeout is killed."""
        out: list[Action] = []
        for wid, t0 in started_ns.items():
            w = self.workers.get(wid)
            if w is None or w.timed_out or w.state != WorkerState.BUSY or wid in self.backups.dropping:
                continue  # (a losing copy being dropped is the backups' to kill: backups.py)
            limit = self.tasks[w.tid].timeout_ns
            if limit is not None and now_ns - t0 > limit:
                w.timed_out = True
                self.s.counters[w.tid].timeout_reclaim_count += 1
                out.append(Kill(wid))
        return out

    def straggling(self, now_ns: int, running: Mapping[int, Running]) -> list[Action]:
        """Event: a look at the running blocks (``running``: per busy worker, its oldest batch's
        running row, that block's start and status). A straggler's unstarted blocks are cut from
        its batches and, once confirmed, given back (:mod:`.giveback`)."""
        return [*straggling(self, now_ns, running), *self.backups.look(now_ns, running)]

    def quit(self, wid: int) -> list[Action]:
        """Ask ``wid`` to quit (no more work for it)."""
        w = self.workers.get(wid)
        if w is None:
            return []
        w.expected_exit = True
        if w.state in (WorkerState.DEAD, WorkerState.QUITTING):
            return []
        if w.queue and not self._abandoned(w.tid):
            raise RuntimeError(f"block worker {wid} told to quit while it runs blocks of a live task")
        w.state = WorkerState.QUITTING  # (an abandoned task's batches stay listed until it exits)
        self._parked.discard(w)
        return [Quit(wid)]

    def stop(self, wid: int) -> list[Action]:
        """We end ``wid`` (the run's end, a grace passed): its exit is not a failure; one that holds no
        batch of a live task is asked to quit."""
        w = self.workers.get(wid)
        if w is None:
            return []
        w.expected_exit = True
        if w.queue and not self._abandoned(w.tid):
            return []  # it is killed holding its batches: they are accounted for at its exit
        return self.quit(wid)

    def dispatch_parked(self) -> list[Action]:
        """Parked workers try again (blocks may have become ready)."""
        out = self._dispatch_parked(self._parked)
        return out + self._dispatch_parked(self.reuse.waiting())  # once the tasks' own workers took theirs

    def _dispatch_parked(self, parked: set[BlockWorker]) -> list[Action]:
        self._parked = self._parked - parked
        out: list[Action] = []
        for w in sorted(parked, key=lambda w: w.wid):  # in start order
            if w.state == WorkerState.PARKED:
                out += self._dispatch(w)
        return out

    def drain(self) -> list[Action]:
        """Every task is done: the workers waiting for work quit."""
        out: list[Action] = []
        for w in list(self.workers.values()):
            if w.state in (WorkerState.IDLE, WorkerState.PARKED, WorkerState.STARTING):
                out += self.quit(w.wid)
        return out

    def end_task(self, tid: str) -> list[Action]:
        """``tid`` was abandoned: its workers are asked to quit, and killed."""
        out: list[Action] = []
        for w in sorted(self.of_task.get(tid, ()), key=lambda w: w.wid):
            out += self.quit(w.wid)
            out.append(Kill(w.wid))
        return out

    def stop_all(self) -> None:
        """The run's end: every worker is ended (by the shell); none of their exits is a failure."""
        for w in self.workers.values():
            w.expected_exit = True

    def abort(self) -> None:
        """The run is being aborted (Ctrl-C, an error): blocks cut short are given back, not failed."""
        self.aborting = True

    # ---------------------------------------------------------------------- decisions
    def _batch_size(self, w: BlockWorker, ready: int) -> int:
        busy = (WorkerState.IDLE, WorkerState.BUSY, WorkerState.PARKED)
        return self.sizing.size(w.tid, ready, sum(1 for x in self.of_task[w.tid] if x.state in busy))

    def _send(self, w: BlockWorker, max_n: int) -> SendBatch | None:
        b = self.s.acquire_blocks(w.tid, max_n)
        if not len(b.index):
            return None
        return self.queue_batch(w, b)

    def queue_batch(self, w: BlockWorker, b) -> SendBatch:
        """Send batch ``b`` (a :class:`daisy_nb.scheduler.BlockBatch`) to ``w``, in its next slot."""
        slot = w.next_slot
        w.next_slot = (slot + 1) % self.slots
        w.queue.append((slot, np.array(b.index, dtype=np.int64)))
        w.state = WorkerState.BUSY
        self._parked.discard(w)
        self.tasks[w.tid].t_first_batch = True
        return SendBatch(w.wid, slot, b)

    def _dispatch(self, w: BlockWorker) -> list[Action]:
        """``w`` has nothing to run: a batch (and maybe a second), park it, or let it go."""
        tid = w.tid
        if w.doomed:
            return []  # killed (it lost a race of copies): it stays idle until it is gone
        if self._abandoned(tid) or self.s.is_task_done(tid):
            return self.reuse.leave(w)
        if self.backups.due:  # a straggler's backup before fresh blocks (.backups)
            copy = self.backups.take_due(w)
            if copy:
                return copy
        ready = self.s.ready_count(tid)
        if ready > 0:
            sent = self._send(w, self._batch_size(w, ready))
            if sent is not None:
                return [sent, *self._prefetch(w)]
        if self.nothing_left(tid) and not self.backups.keep_at_tail(w):
            return self.reuse.leave(w)  # another task's worker, parked for one, or it quits
        self.park(w)
        return []

    def park(self, w: BlockWorker) -> None:
        """``w`` waits for work."""
        w.state = WorkerState.PARKED
        self._parked.add(w)

    def _prefetch(self, w: BlockWorker) -> list[Action]:
        """A second batch behind the one ``w`` runs, if nobody can be held back by it."""
        if len(w.queue) >= self.slots or self._abandoned(w.tid) or w.doomed or self.backups.due.get(w.tid):
            return []  # (a due backup: one of the task's workers is soon free for it)
        active = 0
        for x in self.of_task[w.tid]:
            if x.state in (WorkerState.IDLE, WorkerState.PARKED):
                return []  # a worker waiting for work comes first
            if x.state in (WorkerState.STARTING, WorkerState.BUSY):
                active += 1
        k = self.sizing.ahead(w.tid, self.s.ready_count(w.tid), active)
        sent = self._send(w, k) if k else None
        return [sent] if sent is not None else []

    # ------------------------------------------------------------------------- checks
    def validate(self, held_elsewhere: Mapping[str, int] | None = None) -> None:
        """Raise ``AssertionError`` if an invariant does not hold (see the module docstring).
        ``held_elsewhere``: per task, blocks handed out by other parts (the Client side)."""
        check_invariants(self, held_elsewhere)


def done_statuses(wid: int, status, n: int, mark) -> np.ndarray:
    """The statuses of a batch of ``n`` blocks that ``wid`` reported done: SUCCESS or FAILED, and
    from a cut's ``keep`` on (``mark``, not given back yet) also CREATED: the blocks it left."""
    st = np.asarray(status, dtype=np.uint8)
    ok = (st == _SUCCESS) | (st == _FAILED) if st.shape == (n,) else np.zeros(1, dtype=bool)
    if mark is not None and not mark.settled and st.shape == (n,):
        ok[mark.keep :] |= st[mark.keep :] == _CREATED
    if not ok.all():
        raise RuntimeError(
            f"block worker {wid} reported a batch done with statuses other than SUCCESS/FAILED: {st.tolist()[:16]}"
        )
    return st


def release_queue(core: BlockCore, w: BlockWorker, statuses: list[np.ndarray], running: int) -> None:
    """Release the batches sent to ``w``, in run order, and forget them: finished blocks count,
    the running one gets ``running``, blocks never started (status CREATED) are given back."""
    if len(statuses) != len(w.queue):
        raise RuntimeError(f"block worker {w.wid}: {len(statuses)} status arrays for {len(w.queue)} batches")
    for (_, index), raw in zip(w.queue, statuses):
        n = len(index)
        st = np.array(raw[:n], dtype=np.uint8)
        if st.shape != (n,) or (st > _FAILED).any():
            raise RuntimeError(f"block worker {w.wid}: a batch's statuses are not block statuses: {st.tolist()}")
        w.finished += int(np.count_nonzero(st == _SUCCESS))
        if core.backups.on:  # a copy that dies while its twin runs: the twin decides
            core.backups.ended(w, index, st, None, core.tasks[w.tid].per_block or 0.0)
            index, st = index[st != DROPPED], st[st != DROPPED]
        st[st == _PROCESSING] = running
        core.s.release_blocks(w.tid, index, st)
    w.queue.clear()
    w.cuts.clear()
    if w.state == WorkerState.BUSY:
        w.state = WorkerState.IDLE


def check_invariants(core: BlockCore, held_elsewhere: Mapping[str, int] | None = None) -> None:
    """:meth:`BlockCore.validate`: every block in one batch of one live worker, batches equal to the
    scheduler's processing count, busy exactly when holding batches, parked never busy."""
    core.sizing.validate()
    seen: dict[str, set[int]] = {}
    for wid, w in core.workers.items():
        assert w.wid == wid and w in core.of_task[w.tid], f"worker {wid} not filed under its task"
        assert w.state != WorkerState.DEAD, f"worker {wid} dead but kept"
        if not core.s.is_abandoned(w.tid):
            busy = w.state == WorkerState.BUSY
            assert busy == bool(w.queue), f"worker {wid}: {w.state.name} with {len(w.queue)} batches"
        assert (w in core._parked) <= (w.state == WorkerState.PARKED), f"worker {wid} parked and {w.state.name}"
        # (the pool asks for parked workers through _parked alone: backups.copies_due)
        assert (w.state == WorkerState.PARKED and not w.doomed) <= (w in core._parked), f"worker {wid} parked, unlisted"
        assert len(w.queue) <= core.slots, f"worker {wid} holds {len(w.queue)} batches"
        assert len({k for k, _ in w.queue}) == len(w.queue), f"worker {wid}: two batches in one slot"
        rows = seen.setdefault(w.tid, set())
        assert set(w.cuts) <= {k for k, _ in w.queue}, f"worker {wid}: a cut of a batch it does not hold"
        for k, index in w.queue:
            m = w.cuts.get(k)
            d = core.backups.dropping.get(wid)
            dropped = d is not None and d[0][1] is index
            assert 0 < len(index) <= core.capacity or ((m is not None or w.doomed or dropped) and not len(index)), (
                f"worker {wid}: a batch of {len(index)} blocks"
            )
            assert m is None or (len(index) == m.keep if m.settled else len(index) > m.keep), (
                f"worker {wid}: a batch of {len(index)} blocks cut to {m.keep}"
            )
            for r in index.tolist():
                twins = core.backups.twins.get((w.tid, r), ())
                assert r not in rows or wid in twins, f"block {r} of task {w.tid} in two batches"
                assert not twins or wid in twins, f"block {r} of task {w.tid}: copied, but not to worker {wid}"
                rows.add(r)
    for tid, ws in core.of_task.items():
        for w in ws:
            assert core.workers.get(w.wid) is w, f"task {tid} lists worker {w.wid}, which is gone"
        if core.s.is_abandoned(tid):
            continue
        here = len(seen.get(tid, ()))
        other = (held_elsewhere or {}).get(tid, 0)
        assert here + other == core.s.processing_count(tid), (
            f"task {tid}: {here} blocks in batches + {other} elsewhere, scheduler says {core.s.processing_count(tid)}"
        )


def check_tail(core: BlockCore) -> None:
    """Raise ``AssertionError`` if a worker is parked at its task's tail (nothing ready or pending:
    it should have quit, unless it waits to serve another task, :mod:`.reuse`), once the parked
    workers have tried again (:meth:`BlockCore.dispatch_parked`)."""
    s = core.s
    for tid in {w.tid for w in core.workers.values() if w.state == WorkerState.PARKED}:
        idle = [wid for wid in core.parked_of(tid) if core.reuse.waits_for(core.workers[wid]) is None]
        if core.backups.factor(tid) is not None:  # kept for backup copies: one per block in flight without one
            assert len(idle) <= max(1, core.backups.may_get_copy(tid)), f"task {tid!r}: too many parked"
            continue
        if idle and s.ready_count(tid) == 0 and core.nothing_left(tid):
            raise AssertionError(f"task {tid!r}: workers {idle} parked at its tail")
