"""The block workers' shell: feeds :class:`.blocks.BlockCore` and carries out what it decides.

A part of the pool's worker processes (:class:`.processes.Processes`, which owns the
processes themselves: starting, signalling, exits, reaping). :class:`BlockWorkers` owns
the block workers' decision core and their batches in shared memory
(:class:`.batches.Batches`): it turns what a block worker says (ready, a batch done, a
block raised: :mod:`.wire`), the clock, and the pool's events (dispatch, drain, a task
abandoned, the run's end) into the core's events, and executes the actions the core
returns: a batch written into shared memory and the worker told to run it, a worker
asked to quit, a worker killed (by the process owner's ``kill``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from daisy_nb.runtime.local import _shm, wire
from daisy_nb.runtime.local.batches import Batches
from daisy_nb.runtime.local.blocks import BlockCore, Cut, Drop, ExitReport, Kill, Quit, Retask, SendBatch
from daisy_nb.runtime.local.pool_parts import PoolTaskRun
from daisy_nb.runtime.local.records import BlockProcess
from daisy_nb.runtime.local.starter import CAPACITY

__all__ = ["BlockWorkers", "send"]


def send(w, msg: bytes) -> None:
    """Send ``msg`` to worker ``w``; a dead one's pidfd (or EOF) accounts for it."""
    if w.conn is None:
        return
    try:
        w.conn.send_bytes(msg)
    except OSError:
        pass


class BlockWorkers:
    """The block workers' decisions carried out (see the module docstring)."""

    def __init__(
        self,
        scheduler,
        *,
        batch_target_secs: float,
        workers: Mapping[int, Any],
        kill: Callable[[Any], None],
        workers_total: Callable[[], int],
        retask: Callable[[Any, str], None] | None = None,
    ):
        self.workers = workers  # every worker process, by id (the process owner's registry, read here)
        self._kill = kill
        self._retask = retask  # the process owner's: a worker's set-up for another task (.reuse)
        self.core = BlockCore(
            scheduler, target_secs=batch_target_secs, capacity=CAPACITY, slots=_shm.SLOTS, workers_total=workers_total
        )
        self.batches = Batches(scheduler, self.core)  # the block workers' batches in shared memory

    # ------------------------------------------------------------------ what the pool asks
    def waiting(self, tid: str) -> int:
        return self.core.waiting(tid)

    def alive(self, tid: str) -> int:
        return self.core.alive(tid)

    def register(self, trs: Mapping[str, PoolTaskRun], reuse: str) -> None:
        """The run's block-function tasks, and which of them a worker may move between (:mod:`.reuse`):
        with ``reuse`` ``"any"``, those with the same ``requires``, number of dimensions and
        ``resource_tracking``; with ``"same"``, of those the ones that run the same block function;
        with ``"off"``, none. A task whose restart cap is reached takes no worker."""
        blocks = [tr for tr in trs.values() if tr.arity == 1]

        def key(tr: PoolTaskRun) -> tuple:
            return (tr.requires, tr.ndim, tr.track, tr.fn if reuse == "same" else None)  # (bound methods: ==)

        for tr in blocks:
            self._task(tr)
            same = [u.tid for u in blocks if reuse != "off" and key(u) == key(tr)]
            self.core.reuse.add_task(tr.tid, tr.max_workers, same)
        counters = self.core.s.counters
        self.core.reuse.may_join = lambda tid: not trs[tid].restarts.cap_reached(counters[tid])

    def _task(self, tr: PoolTaskRun) -> None:
        t = self.core.add_task(tr.tid, tr.timeout_ns)
        t.block_secs = tr.block_secs  # one deque: the hang alarm reads the task run's

    def add(self, wid: int, tr: PoolTaskRun):
        """A block worker of ``tr`` starts: the core's record of it."""
        self._task(tr)
        return self.core.add(wid, tr.tid)

    # ------------------------------------------------------------------------ events
    def on_message(self, w: BlockProcess, m: wire.Message, redispatch: bool) -> None:
        """What block worker ``w`` said (``redispatch``: False while a dead worker's last messages are read)."""
        if m.kind == wire.Kind.READY:
            if redispatch:
                self.execute(self.core.ready(w.wid))
        elif m.kind == wire.Kind.DONE:
            self.execute(self.batches.done(w, redispatch))
        elif m.kind == wire.Kind.RAISED:
            assert m.error is not None
            self.batches.raised(w, m.error)
        else:
            raise RuntimeError(f"worker {w.wid} sent {m.kind!r}, a message for workers")

    def exited(self, w: BlockProcess, rc: int, orphan: bool) -> ExitReport:
        return self.batches.exited(w, rc, orphan)

    def tick(self, now_ns: int, workers: Iterable) -> None:
        """Block timeouts (from ``cur``/``cur_start_ns`` in shared memory: time queued does not
        count), and stragglers' batches cut (their unstarted blocks given back)."""
        started = self.batches.started(workers)
        if started:
            self.execute(self.core.tick(now_ns, started))
        running = self.batches.running(workers)
        if running or self.core.backups.dropping:  # (a copy being dropped is not "running": it was cut)
            self.execute(self.core.straggling(now_ns, running))
        else:
            self.core.look_again_ns = None  # no cut waits for a look

    def quit(self, wid: int) -> None:
        self.execute(self.core.quit(wid))

    def stop(self, wid: int) -> None:
        """We end ``wid`` (the run's end, abandonment): its exit is not a failure."""
        self.execute(self.core.stop(wid))

    def dispatch_parked(self) -> None:
        self.execute(self.core.dispatch_parked())

    def drain(self) -> None:
        self.execute(self.core.drain())

    def end_task(self, tid: str) -> None:
        self.execute(self.core.end_task(tid))

    def stop_all(self) -> None:
        self.core.stop_all()

    def forget(self, wid: int) -> None:
        """A worker not reaped at the run's end: the core lets it go."""
        self.core.workers.pop(wid, None)

    def abort(self) -> None:
        self.core.abort()

    # ------------------------------------------------------------------------ actions
    def execute(self, actions: list) -> None:
        for a in actions:
            w = self.workers.get(a.wid)
            if w is None:
                raise RuntimeError(f"an action for worker {a.wid}, which is gone: {a!r}")
            if isinstance(a, SendBatch):
                assert isinstance(w, BlockProcess)
                self.batches.write(w, a.slot, a.blocks)
                send(w, wire.run(a.slot))
            elif isinstance(a, Quit):
                send(w, wire.Kind.QUIT)
            elif isinstance(a, Kill):
                self._kill(w)
            elif isinstance(a, Cut):
                assert isinstance(w, BlockProcess)
                self.batches.cut(w, a.slot, a.keep)
            elif isinstance(a, Drop):
                assert isinstance(w, BlockProcess)
                self.batches.drop(w, a.slot, a.pos)
            elif isinstance(a, Retask):
                if self._retask is None:
                    raise RuntimeError(f"worker {a.wid} moved to task {a.tid!r}, but this pool cannot move workers")
                self._retask(w, a.tid)
            else:
                raise TypeError(f"unknown action {a!r}")
