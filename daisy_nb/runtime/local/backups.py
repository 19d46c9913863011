"""Backup copies of stragglers on the local pool: :mod:`daisy_nb.scheduling.speculation` carried out (sans-I/O).

For a ``Task(speculative=k)``, :class:`PoolBackups` tells the speculation core what the pool
sees and does what it answers, within :class:`.blocks.BlockCore`:

* **what it sees.** A block worker's running block, at the pool's looks at shared memory
  (``Running``: its row and start) is a *copy* of that block (copy id: the worker id and the
  row). Its end is the worker's "batch done" (its status), or the worker's exit. A block
  that finished before any look saw it running counts as done, with its batch's time per
  block (so the task's progress and median block time are right).
* **who runs it.** At its tail (nothing ready, blocks in flight) a speculative task keeps
  workers parked, one per block in flight that had no copy yet at most, instead of letting them quit
  (``docs/explanation/pool.md#tail``); they run the backups.
* **the backup.** At a look, the core names the blocks to copy (once the task's median is
  settled, run past ``k`` times it; at the task's tail, where nothing is ready or waiting and a
  parked worker would idle, 1.5 times). A copy goes to a worker of the task that waits for work
  (parked) as a batch of that one block, without acquiring it again from the Scheduler: the
  block stays in flight once. With no worker parked, the copies are *due*: the next worker
  of the task that has nothing to run takes one before any fresh block, and no batch is sent
  ahead to the task's workers meanwhile, so one is soon free (in the bulk of a task, a
  straggler left alone held its worker for many block times, while a backup that wins
  frees it). Only a block that is the last of its worker's batches is copied (the blocks
  after it were given back first: :mod:`.giveback`, which runs at ``min(4, k)`` times the
  typical block time for such tasks, at the tail at the backup's own factor), so the loser can
  be cut off without losing anything. At the tail a look also asks for the next one just after
  the moment a block in flight reaches the limit (``look_again_ns``, from the core's
  ``next_due``), so the parked worker gets the copy then, not at the pool's next scan.
* **the first success wins.** The batch that reports it releases the block (tracking and
  counters count it once); the other copy is cut from its worker's batch and, if the worker
  runs it, dropped (``Drop``: ``_shm``'s ``drop`` word and a signal, whose handler in the
  worker raises ``BlockDropped`` in the block's body): the worker ends that batch and runs on,
  its ``init_fn`` state kept. The drop is sent again at every look until the batch ends; a
  worker still in the block ``DROP_GRACE_NS`` after the drop (C code that never returns to
  Python, a body that swallowed the exception) is killed as we end a worker (not a crash, no
  restart counted; the pool starts another if blocks wait). A copy that fails, raises or dies
  while its twin runs is dropped: the twin decides, and the Scheduler sees one end of the
  attempt. A backup that runs past ``2k`` times the median itself (and past the far end of the
  task's usual spread) is stopped the same way (the block is slow, not its first attempt): its
  twin runs on.

``read_write_conflict`` blocks need no neighbour check: a block's conflicting neighbours are on
other dependency levels, and none of them runs while it is in flight.

Invariant (in :func:`.blocks.check_invariants`): a block in two batches is a copied block,
in the batches of its two copies' workers, and counts once in flight.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from daisy_nb.block import BlockStatus
from daisy_nb.runtime.local.actions import Cut, Drop, Kill

if TYPE_CHECKING:  # pragma: no cover
    from daisy_nb.runtime.local.giveback import Running
    from daisy_nb.scheduling.speculation import Speculation

__all__ = ["DROPPED", "DROP_GRACE_NS", "PoolBackups"]

DROPPED = 255  # a status :meth:`PoolBackups.ended` writes for a copy's end that does not count
DROP_GRACE_NS = 1_000_000_000  # a losing copy still running this long after its drop: its worker is killed
LOOK_AFTER_NS = 1_000  # the look for a backup comes this long after its block reaches the limit (strictly past it)

_SUCCESS, _PROCESSING = int(BlockStatus.SUCCESS), int(BlockStatus.PROCESSING)
_SHIFT = 40  # copy id = worker id << 40 | row (rows < 2**40)


class PoolBackups:
    """The pool's side of the backups of speculative tasks (module docstring)."""

    def __init__(self, core):  # a .blocks.BlockCore (not imported: it imports this module)
        self.core = core
        s = core.s
        factors = [getattr(s.tasks[tid], "speculative", None) for tid in s.task_ids]
        self.on = any(f is not None for f in factors)
        self.t = {tid: i for i, tid in enumerate(s.task_ids)}
        self.spec: Speculation | None = None  # the core, loaded by a run with a speculative task only
        if self.on:
            from daisy_nb.runtime.net.tail import at_tail
            from daisy_nb.scheduling.speculation import Speculation

            self.spec = Speculation(factors, [s.remaining_count(tid) for tid in s.task_ids])
            self.at_tail = at_tail  # (loaded, like the core, by a run with a speculative task only)
        self.seen: dict[int, dict[int, int]] = {}  # worker id -> its copies: row -> copy id
        self.twins: dict[tuple[str, int], set[int]] = {}  # (task, row) of a copied block -> its workers
        self.due: dict[str, list] = {}  # per task, the backups the last look found no parked worker for
        self.now = 0.0  # the latest clock an event brought (seconds): a due copy's start
        # workers whose losing copy is being interrupted: their batch (the queue's entry, cut) and since when (ns)
        self.dropping: dict[int, tuple[tuple, int]] = {}

    def factor(self, tid: str) -> float | None:
        return None if self.spec is None else self.spec.tasks[self.t[tid]].factor

    def cut_factor(self, tid: str) -> tuple[float, bool] | None:
        """For a speculative task: the factor a backup of ``tid`` waits for now (``k``, at most 1.5
        at the task's tail) and whether it is at its tail; its straggler's blocks behind it are
        given back at that factor (:mod:`.giveback`: the copy waits for the cut). None otherwise."""
        if self.factor(tid) is None:
            return None
        tail = self.at_tail(self.core.s, tid)
        return self.spec.tasks[self.t[tid]].factor_now(tail), tail  # type: ignore[union-attr]

    def keep_at_tail(self, w) -> bool:
        """Whether ``w``, with nothing to take at its task's tail, stays parked for backups: a
        speculative task, while its other parked workers are fewer than its blocks in flight that
        may still get a copy (not abandoned, the run not aborting): :meth:`may_get_copy`."""
        core, tid = self.core, w.tid
        if self.factor(tid) is None or core.aborting or core.s.is_abandoned(tid) or core.s.is_task_done(tid):
            return False
        others = sum(1 for wid in core.parked_of(tid) if wid != w.wid)
        return others < self.may_get_copy(tid)

    def may_get_copy(self, tid: str) -> int:
        """``tid``'s blocks in flight that had no copy in this attempt. Counted from the workers'
        batches (a copied block once), so a block counts from when it was sent, before any look
        saw it running."""
        t, spec = self.t[tid], self.spec
        assert spec is not None  # (called for speculative tasks only)
        rows = {int(r) for w in self.core.of_task.get(tid, ()) for _, rs in w.queue for r in rs}
        return sum(1 for r in rows if not spec.is_backed(t, r))

    def copies_due(self) -> bool:
        """A speculative task has workers parked for backups and blocks in flight: a straggler's
        copy may be due at any look, so the pool looks every ``CHECK_SECS``, not every
        ``POLL_SECS`` (a copy launched up to 0.1 s late was most of a speculative run's tail)."""
        if self.spec is None:
            return False
        if self.dropping:  # a drop is sent again at every look until the copy stops
            return True
        core = self.core
        if not core.parked():  # (asked at every turn of the pool's loop: no scan of the workers in the bulk)
            return False
        return any(self.factor(tid) is not None and core.parked_of(tid) and core.inflight(tid) for tid in self.t)

    # ------------------------------------------------------------------ at a look
    def look(self, now_ns: int, running: Mapping[int, Running]) -> list:
        """Copies the look sees start, and the backups it launches (``SendBatch`` actions)."""
        if self.spec is None:
            return []
        core, spec, now = self.core, self.spec, now_ns / 1e9
        self.now = max(self.now, now)
        out: list = self._drops(now_ns) if self.dropping else []
        now_running: set[tuple[str, int]] = set()  # a worker's earlier rows ended (their "done" may come later)
        for wid, r in running.items():
            w = core.workers.get(wid)
            if w is None or not w.queue or self.factor(w.tid) is None or r.status != _PROCESSING:
                continue
            if not 0 <= r.cur < len(w.queue[0][1]):
                continue
            row = int(w.queue[0][1][r.cur])
            now_running.add((w.tid, row))
            mine = self.seen.setdefault(wid, {})
            if row not in mine and not spec.tasks[self.t[w.tid]].is_done(row):
                copy = wid << _SHIFT | row
                try:
                    spec.started(self.t[w.tid], row, copy, r.start_ns / 1e9)
                except ValueError:  # its one backup in this attempt ran already
                    continue
                mine[row] = copy
        self.due = {}
        for tid, t in self.t.items():
            if spec.tasks[t].factor is None or core.aborting or core.s.is_abandoned(tid):
                continue
            for i in spec.slow_backups(t, now):  # the block is slow, not its first attempt
                self.twins.pop((tid, i.row), None)
                out += self._stop(tid, i.row, i.copy >> _SHIFT)
            idle = sorted(core.parked_of(tid))
            ended = lambda row, tid=tid: (tid, row) not in now_running  # noqa: E731
            tail = self.at_tail(core.s, tid)  # a copy takes only a worker that would idle: 1.5 medians
            for b in spec.candidates(t, now, spec.can_back(t), ended, tail):  # (rows that ended get none)
                orig = self._origin(tid, b)
                if orig is None:
                    continue  # the blocks behind it are not given back yet
                if idle:
                    out.append(self._launch(tid, b.row, core.workers[idle.pop(0)], orig))
                else:
                    self.due.setdefault(tid, []).append(b)
            if tail:  # workers wait parked for copies: the next look when a block reaches its limit
                self._look_at(spec.next_due(t, now, True), now_ns)
        return out

    def _look_at(self, due: float | None, now_ns: int) -> None:
        """Ask for a look just after ``due`` (the block core's ``look_again_ns``, which ends the
        pool's wait), unless one is asked for sooner."""
        if due is None:
            return
        ns = int(due * 1e9) + LOOK_AFTER_NS
        core = self.core
        if ns > now_ns and (core.look_again_ns is None or ns < core.look_again_ns):
            core.look_again_ns = ns

    def take_due(self, w) -> list:
        """``w`` has nothing to run: a due backup of its task for it (a ``SendBatch``), if any is
        still due (its straggler runs on, alone)."""
        due = self.due.get(w.tid)
        while due:
            b = due.pop(0)
            orig = self._origin(w.tid, b)
            if orig is not None and orig is not w and self.spec.alone(b.task, b.row, b.copy):  # type: ignore[union-attr]
                return [self._launch(w.tid, b.row, w, orig)]
        return []

    def _origin(self, tid: str, b):
        """The worker running backup candidate ``b``, if the block is the last it holds."""
        w = self.core.workers.get(b.copy >> _SHIFT)
        return w if w is not None and w.tid == tid and not w.doomed and _last_in_flight(w, b.row) else None

    def _launch(self, tid: str, row: int, p, orig):
        copy = p.wid << _SHIFT | row
        self.spec.started(self.t[tid], row, copy, self.now)  # type: ignore[union-attr]
        self.seen.setdefault(p.wid, {})[row] = copy
        self.twins[(tid, row)] = {orig.wid, p.wid}
        return self.core.queue_batch(p, self.core.s.describe_blocks(tid, [row]))

    # ------------------------------------------------------------------ ends
    def ended(
        self, w, rows: np.ndarray, st: np.ndarray, now_ns: int | None, per_block: float, secs: np.ndarray | None = None
    ) -> list:
        """``w``'s batch ``rows`` ended with statuses ``st`` (a batch done; or, at an exit, 1 for the
        block it was running). Marks, in ``st``, the ends that do not count (the caller
        drops them: :data:`DROPPED`) and returns the actions for the twins to stop (``Cut``, ``Drop``).
        ``secs``: each block's own run time in ns, as the worker wrote it (``_shm``'s ``secs``);
        without it (at an exit) a block's time is :func:`_block_secs`'s estimate."""
        if self.spec is None or self.factor(w.tid) is None:
            return []
        spec, t, now = self.spec, self.t[w.tid], (now_ns / 1e9 if now_ns is not None else None)
        if now is not None:
            self.now = max(self.now, now)
        d = self.dropping.get(w.wid)
        if d is not None and d[0][1] is rows:  # the batch whose copy was dropped ended
            del self.dropping[w.wid]
        mine = self.seen.get(w.wid, {})
        out: list = []
        ran = np.flatnonzero(st >= _SUCCESS)
        last = int(ran[-1]) if len(ran) else -1  # the one row whose end is the batch's end
        for i, row in enumerate(rows.tolist()):
            copy = mine.pop(row, None)
            ok = int(st[i]) == _SUCCESS
            if copy is None:
                if ok and not spec.tasks[t].is_done(row):
                    spec.tasks[t].add_done(row, per_block if secs is None else int(secs[i]) / 1e9)
                continue
            if ok:
                t0 = _start(spec, copy)
                took = _block_secs(now, t0, i == last, per_block, len(ran)) if secs is None else int(secs[i]) / 1e9
                o = spec.finished(t, row, copy, t0 + took, True)
            else:
                o = spec.lost(copy)
            if not o.counts:
                st[i] = DROPPED
            pair = self.twins.get((w.tid, row))
            if pair is not None:
                pair.discard(w.wid)
                if o.counts or len(pair) < 2:
                    del self.twins[(w.tid, row)]
            if o.interrupt is not None:
                out += self._stop(w.tid, row, o.interrupt.copy >> _SHIFT)
        if not mine:
            self.seen.pop(w.wid, None)
        return out

    def _stop(self, tid: str, row: int, wid: int) -> list:
        """The losing copy's worker: the block cut from its batches and, if it runs it, interrupted
        (``Drop``: a signal; the worker runs on with what its ``init_fn`` loaded). :meth:`_drops`
        sends the drop again until the copy stops, and kills the worker (an expected exit, no
        restart counted) if it still runs the block ``DROP_GRACE_NS`` later (a body in C code that
        does not return, or one that swallowed the interrupt)."""
        w = self.core.workers.get(wid)
        if w is None:
            return []
        out: list = []
        for i, (slot, rows) in enumerate(w.queue):
            if len(rows) and int(rows[-1]) == row:
                entry = (slot, rows[:-1])
                w.queue[i] = entry
                w.cuts.pop(slot, None)
                out.append(Cut(wid, slot, len(rows) - 1))  # if it has not started it yet, it will not
                out.append(Drop(wid, slot, len(rows) - 1))  # if it runs it, it stops
                self.dropping[wid] = (entry, int(self.now * 1e9))
                break
        mine = self.seen.get(wid, {})
        copy = mine.pop(row, None)
        if copy is not None:
            self.spec.lost(copy)  # type: ignore[union-attr]  # told to stop: its end counts for nothing
        return out

    def _drops(self, now_ns: int) -> list:
        """The drops under way: sent again while the batch is not done, the worker killed after
        ``DROP_GRACE_NS`` (:meth:`_stop`)."""
        out: list = []
        for wid, (entry, since) in sorted(self.dropping.items()):
            w = self.core.workers.get(wid)
            if w is None or not any(e is entry for e in w.queue):  # gone, or the batch ended
                del self.dropping[wid]
                continue
            slot, rows = entry
            if now_ns - since <= DROP_GRACE_NS:
                out.append(Drop(wid, slot, len(rows)))
                continue
            del self.dropping[wid]
            w.expected_exit = True  # not a crash, no restart
            w.doomed = True  # nothing more is sent to it
            out.append(Kill(wid))
        return out


def _last_in_flight(w, row: int) -> bool:
    """``row`` is the last block ``w`` holds: the end of its oldest batch, any later batch empty."""
    if not w.queue:
        return False
    rows0 = w.queue[0][1]
    return bool(len(rows0)) and int(rows0[-1]) == row and all(not len(r) for _, r in list(w.queue)[1:])


def _block_secs(now: float | None, t0: float, last: bool, per_block: float, ran: int) -> float:
    """The run time of a copy that started at ``t0`` and succeeded in a batch that ``ran`` blocks
    in ``per_block`` seconds each, ``now`` its "done" (None: at an exit), where its worker's own
    time for it is not known (the batches of a worker that died). Only the batch's last block
    ended at its "done" (less the message's way to the pool: capped by the batch's own run
    time); an earlier one's end is not known, and is taken as the batch's time per block, as is
    a block's at an exit. (Taking every block's end as its batch's "done" made the median, hence
    the backup threshold, about 1.5 times too long on batches of 2-3 blocks; the batch's time
    per block narrowed the spread the rule saw: on lognormal blocks with sigma 1, copies came
    ~5.5 medians into a block where the rule says 10. So the workers now write each block's own
    time: ``_shm``'s ``secs``.)"""
    if now is None or not last:
        return per_block
    return max(0.0, min(now - t0, per_block * ran))


def _start(spec: Speculation, copy: int) -> float:
    t0 = spec.start_of(copy)
    return 0.0 if t0 is None else t0
